"""The classic question reproduced: does an fp16 convolution accumulate in fp16?

    python experiments/classic_question/run.py [--config config.json] [--output DIR]

Runs, through the same probe runner as the CLI (each TensorFlow configuration in
its own fresh process):

- the 65519 test (`overflow`) on every accumulation request of TensorFlow and
  the emulator, plus the emulator models that give each of the three outcomes;
- real versus fake fp16 (`compare`) on the question's shapes.

Writes to DIR (default: experiments/classic_question/results/): overflow.json,
compare.json and three_way.json (every record with its provenance), the same as
CSV tables, and figures: overflow.png (table), compare.png (table) and
ulp_histogram.png (emulator models on the question's inputs).
"""

from __future__ import annotations

from pathlib import Path

from convprobe import experiment

HERE = Path(__file__).resolve().parent

#: table_figure sizes columns by character count; a long lower-case header keeps the
#: upper-case variable names from being clipped.
ENV_HEADER = "environment variables set in the configuration's own process"


def main(argv=None) -> int:
    args = experiment.parser(__doc__, HERE).parse_args(argv)
    config, output = experiment.load(args)

    import pandas as pd

    from convprobe.analysis import figures, ulp_error
    from convprobe.backends import EmulatedBackend
    from convprobe.backends.configurations import resolve_configs
    from convprobe.probes import compare, run_probe
    from convprobe.probes.reference import conv2d_float64

    configs = list({c.label: c for c in resolve_configs(
        backend=config["backend"], accumulate=config["accumulate"], device=config["device"])}.values())
    three_way = [c for spec in config["three_way_models"] for c in resolve_configs(backend="emulated", model=spec)]

    overflow = run_probe("overflow", configs)
    experiment.write_probe_results("overflow", {}, overflow, output / "overflow.json", ("output",))
    three_way_results = run_probe("overflow", three_way)
    experiment.write_probe_results("overflow", {}, three_way_results, output / "three_way.json", ("output",))
    compare_params = {"seed": config["seed"], **config["compare_shapes"]}
    compared = run_probe("compare", configs, compare_params)
    experiment.write_probe_results("compare", compare_params, compared, output / "compare.json",
                                   ("max_abs_diff", "fraction_different"))

    rows = [r.to_row(("output",)) for r in overflow + three_way_results]
    table = pd.DataFrame(rows).drop_duplicates("configuration")
    table = table[["configuration", "environment", "requested", "output", "accumulation", "honoured"]]
    table = table.rename(columns={"environment": ENV_HEADER})
    table["output"] = table["output"].map(lambda v: ", ".join(v) if isinstance(v, list) else str(v))
    figures.table_figure(table, title="The 65519 test (0: wide accumulation, inf: fp16 FMA chain, nan: fp16 products)",
                         highlight={**figures.DEFAULT_HIGHLIGHT, "NO": "#f4a6a6"}).savefig(output / "overflow.png", dpi=110)
    compare_rows = pd.DataFrame([{
        "configuration": r.config.label, "requested": r.config.accumulate,
        "max |real-fake|": f"{r.observed.get('max_abs_diff', float('nan')):.4g}",
        "differ": f"{r.observed.get('fraction_different', float('nan')):.2%}",
        "real max ulp": f"{r.observed.get('real', {}).get('max_ulp_error', float('nan')):.3f}",
        "fake max ulp": f"{r.observed.get('fake', {}).get('max_ulp_error', float('nan')):.3f}",
        "accumulation": r.accumulation or r.status,
    } for r in compared])
    figures.table_figure(compare_rows, title="Real versus fake fp16 (errors against fp64, in fp16 ulps)") \
        .savefig(output / "compare.png", dpi=110)

    x, w = compare.inputs(config["seed"], **config["compare_shapes"])
    reference = conv2d_float64(x, w)
    ulps = {spec: ulp_error(EmulatedBackend(spec).conv2d(x, w), reference, "fp16") for spec in config["histogram_models"]}
    figures.ulp_histogram_figure(ulps, "fp16", title="ULP error per output on the question's inputs (exact emulator)") \
        .savefig(output / "ulp_histogram.png", dpi=110)

    for r in overflow + compared:
        print(f"{r.probe:9s} {r.config.label:28s} {r.status:8s} {r.accumulation or '-':5s} {r.verdict}")
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
