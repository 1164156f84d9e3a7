"""The TensorFlow configuration matrix: what each precision setting really does.

    python experiments/tf_matrix/run.py [--config config.json] [--output DIR]

Every configuration of `convprobe.backends.configurations.MATRIX` for the
device ("all" includes the control rows) runs in its own fresh process:

- the 65519 test and real versus fake fp16 (probe runner, as the CLI);
- the fingerprint battery on every op (`convprobe fingerprint`, run as the CLI
  a user would type), which infers accumulator bits, rounding, product
  rounding, subnormals, overflow and block size.

Writes to DIR (default: experiments/tf_matrix/results/): overflow.json and
compare.json (records with provenance) and their CSVs, fingerprint.csv (the
CLI's tidy table, provenance in every row), and
figures overflow.png and fingerprint.png (tables, fp16 cells warm, fp32 cool).
"""

from __future__ import annotations

import os
import subprocess
import sys
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

    from convprobe.analysis import figures, tables
    from convprobe.backends.configurations import matrix_configs
    from convprobe.probes import run_probe

    configs = matrix_configs(config["device"], config["configurations"])
    timeout = float(config["timeout_s"])
    for probe, params in (("overflow", {}), ("compare", {"seed": config["seed"], **config["compare_shapes"]})):
        results = run_probe(probe, configs, params, timeout=timeout)
        experiment.write_probe_results(probe, params, results, output / f"{probe}.json")
        for r in results:
            print(f"{probe:9s} {r.config.label:40s} {r.status:8s} {r.accumulation or '-':5s} {r.verdict or r.error}")
        if probe == "overflow":
            table = pd.DataFrame([{**r.to_row(), "output": ", ".join(r.observed.get("output", [])) or r.status}
                                  for r in results])
            table = table[["configuration", "environment", "requested", "output", "accumulation", "honoured"]]
            table = table.rename(columns={"environment": ENV_HEADER})
            figures.table_figure(table, title="The 65519 test across the configuration matrix",
                                 highlight={**figures.DEFAULT_HIGHLIGHT, "NO": "#f4a6a6"}) \
                .savefig(output / "overflow.png", dpi=110)

    names = ",".join(c.name for c in configs)
    base = [sys.executable, "-m", "convprobe", "fingerprint", "--configs", names, "--device", config["device"],
            "--op", config["fingerprint_ops"], "--seed", str(config["seed"]), "--timeout", str(int(timeout))]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([*base, "--output", str(output / "fingerprint.csv")], check=True, env=env)
    fingerprint = tables.fingerprint_table(tables.read_table(output / "fingerprint.csv", "probe"))
    # read_table (pandas) reads the CLI's "n/a" cells as missing values, which print as "nan".
    fingerprint = fingerprint.replace("nan", "n/a")
    figures.table_figure(fingerprint, title="Fingerprint: inferred arithmetic per configuration and op",
                         max_rows=max(60, len(fingerprint))).savefig(output / "fingerprint.png", dpi=110)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
