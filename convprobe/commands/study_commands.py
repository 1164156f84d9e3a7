"""`convprobe fingerprint`, `identify`, `sweep` and `report`: the study commands.

The first three run a probe over the TensorFlow configuration matrix
(`configurations.MATRIX`, each configuration in its own process, in parallel)
and over any emulator models given with --model (in this process); `report`
turns their result files into figures. Every result file is a JSON document
with `schema_version`, `kind` and provenance, or a tidy CSV table of the
analysis schemas; anything else is refused with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from convprobe.commands.argtypes import (add_output_options, add_running_options,
                                         announce_inherited_switches, bounded_int, check_output,
                                         int_list)
from convprobe.backends.configurations import DEVICE_CHOICES
from convprobe.render import json_clean

__all__ = ["register", "KINDS", "load_results"]

#: The result documents these commands write (JSON `kind`).
KINDS = ("fingerprint", "identify", "sweep")
FIGURE_FORMATS = ("png", "svg")
MAX_K = 65536  # reduction lengths: 4x the battery's longest row
MAX_ROWS = 4096

#: Short column titles for the fingerprint table (the JSON keeps the full property names).
_SHORT = {
    "accumulation": "accumulation", "accumulator_bits": "acc bits", "extra_bits": "extra",
    "rounding": "rounding", "double_rounding": "2x round", "product_bits": "products", "subnormal_inputs": "subn in",
    "subnormal_results": "subn out", "overflow": "overflow", "accumulator_range": "acc range",
    "product_overflow": "65519 test", "block_size": "block", "chunk_size": "chunk",
}


def _add_common(parser: argparse.ArgumentParser, *, default_ops: str) -> None:
    config = parser.add_argument_group("configurations")
    config.add_argument("--configs", default=None, metavar="NAMES",
                        help="TensorFlow configurations of the matrix, comma-separated, 'all', or 'none' "
                             "(default: the matrix's default rows; see 'convprobe fingerprint --list-configs')")
    config.add_argument("--device", choices=DEVICE_CHOICES, default="cpu", help="device (default: cpu)")
    config.add_argument("--model", action="append", default=[], metavar="SPEC",
                        help="also run the exact emulator with this model (repeatable), e.g. sequential:fp16")
    config.add_argument("--op", default=default_ops, metavar="OPS",
                        help=f"ops, comma-separated or 'all' (default: {default_ops})")
    config.add_argument("--list-configs", action="store_true", help="list the configuration matrix and exit")
    add_running_options(parser, timeout=600)
    add_output_options(parser, format_help="what to print",
                       output_help="write the results: FILE.json (document with provenance) or FILE.csv (tidy table)")


def register(subparsers) -> None:
    fingerprint = subparsers.add_parser(
        "fingerprint",
        help="crafted-input battery: accumulator bits, rounding, products, subnormals, overflow, block size",
        description=(
            "Run the fingerprint battery through each op under each configuration and infer the "
            "arithmetic: significand bits of partial sums (several orderings), rounding, product "
            "rounding, subnormals, overflow, block and chunk sizes. One row per configuration x op."
        ),
    )
    _add_common(fingerprint, default_ops="all")
    fingerprint.add_argument("--evidence", action="store_true", help="print the evidence behind each cell")
    fingerprint.set_defaults(handler=_fingerprint)

    identify = subparsers.add_parser(
        "identify",
        help="find the emulator model that reproduces an op bit for bit, per reduction length K",
        description=(
            "Run seeded random dot products of length K (16 ... 8192) through each op and search "
            "the emulator's model family for the one that matches the outputs bit for bit; report "
            "the match fraction per K and the K at which the best model stops matching."
        ),
    )
    _add_common(identify, default_ops="conv2d,conv2d_backprop_input,conv2d_backprop_filter")
    identify.add_argument("--candidates", metavar="SPECS",
                          help="comma-separated model specs to search instead of the default family")
    identify.add_argument("--ks", type=int_list(1, MAX_K), default=None, metavar="K,K,...",
                          help=f"reduction lengths, 1 to {MAX_K} (default: 16,32,...,8192)")
    identify.add_argument("--rows", type=bounded_int(1, MAX_ROWS), default=None,
                          help=f"dot products per K, 1 to {MAX_ROWS} (default: 64)")
    identify.set_defaults(handler=_identify)

    sweep = subparsers.add_parser(
        "sweep",
        help="error versus reduction length K and input distribution, as a tidy table",
        description=(
            "Measure error against the exact result for K = 9 ... 18432 and four input "
            "distributions, per configuration, model and op; flag errors above the probabilistic "
            "bound and fp16 stagnation."
        ),
    )
    _add_common(sweep, default_ops="conv2d")
    sweep.add_argument("--ks", type=int_list(1, MAX_K), default=None, metavar="K,K,...",
                       help=f"reduction lengths, 1 to {MAX_K} (default: 9,18,...,18432)")
    sweep.add_argument("--distributions", default="all", metavar="NAMES",
                       help="uniform01, uniform11, normal, heavy_tailed, comma-separated or 'all' (default)")
    sweep.add_argument("--rows", type=bounded_int(1, MAX_ROWS), default=None,
                       help=f"outputs per point, 1 to {MAX_ROWS} (default: 32)")
    sweep.add_argument("--bound-format", default="fp16", metavar="FMT",
                       help="accumulator format of the bound columns and exceeds flag (default: fp16)")
    sweep.set_defaults(handler=_sweep)

    report = subparsers.add_parser(
        "report",
        help="render result files (fingerprint, identify, sweep) as figures",
        description="Render figures from result files written by fingerprint, identify and sweep (--output).",
    )
    report.add_argument("results", nargs="+", metavar="RESULTS", help="result files (.json documents or .csv tables)")
    report.add_argument("--out-dir", default="figures", metavar="DIR", help="where figures go (default: figures)")
    report.add_argument("--formats", default="png,svg", metavar="FMTS", help="png, svg or both (default: png,svg)")
    report.set_defaults(handler=_report)


# -- shared plumbing -------------------------------------------------------------


def _configs(args):
    """TensorFlow matrix rows plus emulator models, validated before anything runs."""
    from convprobe.backends.configurations import emulated_config, matrix_configs

    configs = []
    if args.configs != "none":
        names = None if args.configs is None else args.configs
        configs += matrix_configs(args.device, names)
    configs += [emulated_config(spec) for spec in args.model]
    if not configs:
        from convprobe.errors import InvalidArgument

        raise InvalidArgument("nothing to run: --configs none and no --model")
    return configs


def _list_configs(args) -> int:
    """The matrix rows of a device; listing needs no GPU (it only says what would run)."""
    from convprobe.backends.configurations import MATRIX, MATRIX_DEFAULT, resolve_device

    device = args.device if args.device in MATRIX else resolve_device(args.device)
    for name, (env, jit, _acc, note) in MATRIX[device].items():
        default = "*" if name in MATRIX_DEFAULT[device] else " "
        settings = " ".join(f"{k}={v}" for k, v in env.items()) or "(nothing set)"
        print(f"{default} {name:24s} jit={'on ' if jit else 'off'} {settings}  # {note}")
    print("(* = run by default; on CPU the cuDNN/cuBLAS switches change nothing, so only the "
          "'gpu-switches' control row carries them)")
    return 0


def _document(kind: str, args, params: dict, results, extra: dict | None = None) -> dict:
    from convprobe import provenance
    from convprobe.provenance import SCHEMA_VERSION

    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "params": params,
        "provenance": provenance.collect(seed=args.seed, device=args.device),
        "results": [r.to_record() for r in results],
        **(extra or {}),
    }


def _write(args, document: dict, frame, schema: str) -> None:
    from convprobe.errors import InvalidArgument
    from convprobe.render import render_json, write_atomic

    if not args.output:
        return
    path = Path(args.output)
    if path.suffix.lower() == ".json":
        write_atomic(str(path), render_json(json_clean(document)))
    elif path.suffix.lower() == ".csv":
        from convprobe.analysis.tables import write_table

        path.parent.mkdir(parents=True, exist_ok=True)
        write_table(frame, path, schema)
    else:
        raise InvalidArgument(f"output must end in .json or .csv; received {args.output!r}")


def _print(args, rows: list[dict], columns: list[str], document: dict, frame) -> None:
    from convprobe.render import render_json, render_table

    if args.format == "table":
        sys.stdout.write(render_table(rows, columns))
    elif args.format == "json":
        sys.stdout.write(render_json(json_clean(document)))
    else:
        sys.stdout.write(frame.to_csv(index=False))


# -- fingerprint -------------------------------------------------------------------


def _fingerprint(args) -> int:
    if args.list_configs:
        return _list_configs(args)
    check_output(args.output, "json", allowed=("json", "csv"))
    announce_inherited_switches(args.command)
    from convprobe.analysis.tables import fingerprint_table, frame_from_records
    from convprobe.probes.fingerprint import PROPERTIES, infer_observed, run_grouped
    from convprobe.probes.fingerprint_ops import check_ops

    ops = check_ops(args.op)
    configs = _configs(args)
    params = {"ops": list(ops), "seed": args.seed}
    results = run_grouped(configs, params, timeout=args.timeout, jobs=args.jobs)
    records, per_config = [], {}
    for result in results:
        per_op = infer_observed(result.observed) if result.status == "ok" else {}
        per_config[result.config.label] = per_op
        for op in ops:
            entry = per_op.get(op, {"status": result.status, "error": result.error, "properties": {}})
            base = {**result.identity(), "op": op, "probe": "fingerprint", "seed": args.seed}
            if entry["status"] != "ok":
                records.append({**base, "property": "status", "value": None, "status": entry["status"],
                                "detail": entry.get("error"), "evidence": None})
                continue
            for prop in PROPERTIES:
                cell = entry["properties"][prop]
                records.append({**base, "property": prop, "value": cell["value"], "evidence": cell["evidence"],
                                "status": "ok", "detail": None})
    frame = frame_from_records(records, "probe")
    wide = fingerprint_table(frame, PROPERTIES)
    table_rows = [{("configuration" if k == "configuration" else _SHORT.get(k, k)): v for k, v in row.items()}
                  for row in wide.to_dict(orient="records")]
    columns = ["configuration", "op", *(_SHORT[p] for p in PROPERTIES)]
    document = _document("fingerprint", args, params, results,
                         {"table": {"schema": "probe", "rows": json.loads(frame.to_json(orient="records"))}})
    _print(args, table_rows, columns, document, frame)
    if args.format == "table":
        for result in results:
            if result.status != "ok":
                print(f"  {result.config.label}: {result.status}: {result.error}")
        if args.evidence:
            for label, per_op in per_config.items():
                for op, entry in per_op.items():
                    for prop, cell in entry.get("properties", {}).items():
                        print(f"  {label} {op} {prop} = {cell['value']}: {cell['evidence']}")
    _write(args, document, frame, "probe")
    return 0


# -- identify ----------------------------------------------------------------------


def _identify(args) -> int:
    if args.list_configs:
        return _list_configs(args)
    check_output(args.output, "json", allowed=("json", "csv"))
    announce_inherited_switches(args.command)
    from convprobe.analysis.tables import frame_from_records
    from convprobe.probes import identify
    from convprobe.probes.fingerprint_ops import check_ops
    from convprobe.probes.runner import run_probe

    ops = check_ops(args.op)
    specs = None
    if args.candidates is not None:
        from convprobe.emulation.composites import split_arguments
        from convprobe.errors import InvalidArgument

        specs = split_arguments(args.candidates)  # commas inside splitk(...) stay
        if not specs:
            raise InvalidArgument(f"--candidates must name at least one model spec; received "
                                  f"{args.candidates!r}")
    identify.candidates(specs)  # bad specs fail before anything runs
    ks = args.ks or list(identify.DEFAULT_KS)
    rows = args.rows or identify.DEFAULT_ROWS
    configs = _configs(args)
    params = {"ops": list(ops), "ks": ks, "rows": rows, "seed": args.seed}
    results = run_probe("identify", configs, params, timeout=args.timeout, jobs=args.jobs)
    table_rows, records, matches = [], [], {}
    for result in results:
        per_op = identify.identify_observed(result.observed, specs) if result.status == "ok" else {}
        matches[result.config.label] = {op: {"status": e["status"], "error": e["error"], "summary": e["summary"],
                                             "table": {n: {str(k): f for k, f in fr.items()} for n, fr in e["table"].items()}}
                                        for op, e in per_op.items()}
        for op in ops:
            entry = per_op.get(op, {"status": result.status, "error": result.error, "summary": {}})
            base = {**result.identity(), "op": op, "probe": "identify", "seed": args.seed}
            row = {"configuration": result.config.label, "op": op, "status": entry["status"]}
            if entry["status"] != "ok":
                row["best model"] = entry.get("error") or entry["status"]
                records.append({**base, "property": "status", "value": None, "status": entry["status"],
                                "detail": entry.get("error"), "evidence": None})
                table_rows.append(row)
                continue
            summary = entry["summary"]
            stop = summary["stops_matching_at"]
            row["best model"] = summary["best"]
            row["stops at K"] = "-" if stop is None else stop
            for k, fraction in summary["fractions"].items():
                row[f"K={k}"] = f"{fraction:.0%}"
            row["ties"] = len(summary["perfect"]) if summary["perfect"] else 0
            table_rows.append(row)
            records.append({**base, "property": "best_model", "value": summary["best"], "status": "ok", "detail": None,
                            "evidence": f"most bitwise matches over K = {', '.join(map(str, summary['fractions']))}"})
            records.append({**base, "property": "stops_matching_at", "value": "-" if stop is None else str(stop),
                            "status": "ok", "detail": None, "evidence": "first K with a match fraction below 1"})
            for k, fraction in summary["fractions"].items():
                records.append({**base, "property": f"match_fraction_k{k}", "value": f"{fraction:.6g}", "status": "ok",
                                "detail": None, "evidence": f"{summary['best']} vs observed, {rows} outputs"})
    frame = frame_from_records(records, "probe")
    columns = ["configuration", "op", "status", "best model", "stops at K", *(f"K={k}" for k in ks), "ties"]
    document = _document("identify", args, params, results, {"matches": matches})
    _print(args, table_rows, columns, document, frame)
    if args.format == "table":
        print("  (match = share of outputs bitwise equal to the model's; 'ties' = models matching at every K)")
    _write(args, document, frame, "probe")
    return 0


# -- sweep -------------------------------------------------------------------------


def _sweep(args) -> int:
    if args.list_configs:
        return _list_configs(args)
    check_output(args.output, "json", allowed=("json", "csv"))
    announce_inherited_switches(args.command)
    from convprobe.analysis.tables import add_bounds, frame_from_records
    from convprobe.formats import parse_format
    from convprobe.probes import sweep
    from convprobe.probes.fingerprint_ops import check_ops
    from convprobe.probes.runner import run_probe

    ops = check_ops(args.op)
    dists = sweep.check_distributions(args.distributions)
    parse_format(args.bound_format, argument="bound-format")
    ks = args.ks or list(sweep.DEFAULT_KS)
    rows = args.rows or sweep.DEFAULT_ROWS
    configs = _configs(args)
    params = {"ops": list(ops), "ks": ks, "distributions": list(dists), "rows": rows, "seed": args.seed}
    results = run_probe("sweep", configs, params, timeout=args.timeout, jobs=args.jobs)
    records = [r for result in results for r in sweep.records(result, args.seed)]
    frame = add_bounds(frame_from_records(records, "sweep"), args.bound_format)
    ulps = {r.config.label: {op: e.get("ulp_errors_at_largest_k", {}) for op, e in r.observed.get("ops", {}).items()}
            for r in results if r.status == "ok"}
    document = _document("sweep", args, params, results,
                         {"table": {"schema": "sweep", "rows": json.loads(frame.to_json(orient="records"))}, "ulp_errors": ulps})
    for r in document["results"]:
        r["observed"] = {"summary": "see table"}  # the table holds every point; keep the file small
    table_rows = []
    for rec in frame.to_dict(orient="records"):
        table_rows.append({
            "configuration": rec["configuration"], "op": rec["op"], "status": rec["status"],
            "distribution": rec["distribution"], "K": rec["k"],
            "max err/sum|xw|": rec["max_abs_sum_error"], "median ulp": rec["median_ulp_error"],
            f"lambda*sqrt(K)*u ({args.bound_format})": rec["probabilistic_bound"],
            "exceeds": _flag(rec["exceeds_probabilistic"]), "stagnated": _flag(rec["stagnated"]),
        })
    columns = list(table_rows[0]) if table_rows else []
    _print(args, table_rows, columns, document, frame)
    _write(args, document, frame, "sweep")
    return 0


def _flag(value) -> str:
    import pandas as pd

    if value is None or value is pd.NA:
        return "-"
    try:
        if pd.isna(value):
            return "-"
    except (TypeError, ValueError):
        pass
    return "YES" if bool(value) else "no"


# -- report ------------------------------------------------------------------------


def load_results(path: str):
    """(kind, document or None, frame) from a result file; InvalidArgument for anything else."""
    from convprobe.analysis.tables import read_table, validate_frame
    from convprobe.errors import InvalidArgument
    from convprobe.provenance import SCHEMA_VERSION

    p = Path(path)
    if not p.is_file():
        raise InvalidArgument(f"results file {path!r} does not exist")
    if p.suffix == ".csv":
        import pandas as pd

        try:
            columns = list(pd.read_csv(p, nrows=0).columns)
        except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"results file {p.name} is not a readable CSV table ({exc})") from exc
        schema = "sweep" if "distribution" in columns else "probe"
        frame = read_table(p, schema)
        kind = "sweep" if schema == "sweep" else _probe_kind(frame, p.name)
        return kind, None, frame
    if p.suffix != ".json":
        raise InvalidArgument(f"results file {p.name} must be .json or .csv; received {p.suffix or 'no suffix'}")
    try:
        document = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"results file {p.name} is not valid JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise InvalidArgument(f"results file {p.name} is not a convprobe result (expected a JSON object)")
    if "schema" in document and "rows" in document:
        schema = document["schema"]
        if schema not in ("sweep", "probe"):
            raise InvalidArgument(f"results file {p.name} holds a {schema!r} table; report reads sweep and probe tables")
        frame = read_table(p, schema)
        return ("sweep" if schema == "sweep" else _probe_kind(frame, p.name)), None, frame
    kind = document.get("kind")
    if kind not in KINDS:
        raise InvalidArgument(f"results file {p.name} has kind {kind!r}; report reads {', '.join(KINDS)} results")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InvalidArgument(f"results file {p.name} has schema_version {version!r}; this convprobe reads version {SCHEMA_VERSION}")
    table = document.get("table")
    frame = None
    if table is not None:
        import pandas as pd

        if not isinstance(table, dict) or "rows" not in table:
            raise InvalidArgument(f"results file {p.name}: 'table' must hold 'rows'")
        frame = validate_frame(pd.DataFrame(table["rows"]), table.get("schema", "probe"), where=f"results file {p.name}")
    elif kind != "identify":
        raise InvalidArgument(f"results file {p.name} has no 'table'")
    if kind == "identify" and not isinstance(document.get("matches"), dict):
        raise InvalidArgument(f"results file {p.name} has no 'matches'")
    return kind, document, frame


def _probe_kind(frame, name: str) -> str:
    from convprobe.errors import InvalidArgument

    probes = set(frame["probe"])
    if probes <= {"fingerprint"}:
        return "fingerprint"
    if probes <= {"identify"}:
        return "identify"
    raise InvalidArgument(f"results file {name} mixes probes {sorted(probes)}; report reads fingerprint or identify tables")


def _report(args) -> int:
    from convprobe.errors import InvalidArgument, invalid_choice

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        if f not in FIGURE_FORMATS:
            raise invalid_choice("formats", f, FIGURE_FORMATS)
    if not formats:
        raise InvalidArgument("formats must name at least one of png, svg")
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidArgument(f"--out-dir must be a directory; received the file {args.out_dir!r}")
    check_output(str(out_dir / "figure.png"), "png")
    loaded = [(path, *load_results(path)) for path in args.results]  # all validated before any figure
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path, kind, document, frame in loaded:
        stem = Path(path).stem
        for name, fig in _figures(kind, document, frame):
            for fmt in formats:
                target = out_dir / f"{stem}-{name}.{fmt}"
                fig.savefig(target, dpi=150 if fmt == "png" else None)
                written.append(str(target))
    for target in written:
        print(target)
    return 0


_HIGHLIGHT_EXTRA = {
    "fp16, products to 11 bits": "#f9b98a", "11": "#fcd5b4", "24": "#c6dbef", ">=39": "#9ecae1",
    "exact/wide": "#9ecae1", "inf (fp16 fused chain)": "#fcd5b4", "NaN (fp16 products)": "#f9b98a",
    "0 (wide or fused)": "#c6dbef", "fp32, products to 11 bits": "#e3d7f0",
}


def _figures(kind: str, document: dict | None, frame):
    """(name, Figure) pairs for one result."""
    from convprobe.analysis import figures

    if kind == "fingerprint":
        from convprobe.analysis.tables import fingerprint_table
        from convprobe.probes.fingerprint import PROPERTIES

        wide = fingerprint_table(frame, [p for p in PROPERTIES if p in set(frame["property"])] or None)
        wide = wide.rename(columns=_SHORT)
        wide["configuration"] = wide["configuration"].str.replace("tensorflow/", "tf/", regex=False)
        highlight = {**figures.DEFAULT_HIGHLIGHT, **_HIGHLIGHT_EXTRA}
        yield "table", figures.table_figure(wide, title="Fingerprint: what each configuration and op really computes",
                                            highlight=highlight, max_rows=max(60, len(wide)))
        return
    if kind == "identify":
        from convprobe.probes.identify import identify_figure

        if document is not None:
            matches = document["matches"]
        else:
            matches = _matches_from_frame(frame)
        ops = sorted({op for per_op in matches.values() for op in per_op})
        for op in ops:
            yield f"match-{op}", identify_figure(matches, op)
        return
    ok = frame[frame["status"] == "ok"].copy()
    ok["configuration"] = ok["configuration"].map(_short_label)
    for op in dict.fromkeys(ok["op"]):
        for dist in dict.fromkeys(ok[ok["op"] == op]["distribution"]):
            part = ok[(ok["op"] == op) & (ok["distribution"] == dist)]
            yield f"error-vs-k-{op}-{dist}", figures.error_vs_k_figure(
                part, accumulators=("fp16", "fp32"), output="fp16", facet=None,
                title=f"{op}, {dist} inputs: worst error / Σ|x·w| versus K\n"
                      "(bounds for fp16 and fp32 accumulation, each + one fp16 output rounding)")
    if document is not None and document.get("ulp_errors"):
        per_op: dict[str, dict[str, list]] = {}
        for label, ops in document["ulp_errors"].items():
            for op, dists in ops.items():
                for dist, entry in dists.items():
                    if dist == "uniform01":
                        values = [float(v) for v in entry["ulp_errors"]]
                        per_op.setdefault(op, {})[_short_label(label)] = values
                        largest = entry["k"]
        for op, series in per_op.items():
            yield f"ulp-{op}", figures.ulp_histogram_figure(
                series, "fp16", title=f"{op}: ULP errors at K = {largest}, U[0,1) inputs")


def _short_label(label: str) -> str:
    """'tensorflow/cpu/jit+strict' -> 'tf jit+strict'; 'emulated/sequential:fp32:output=fp16' -> 'emu seq:fp32'."""
    if label.startswith("tensorflow/"):
        return "tf " + label.split("/", 2)[-1]
    if label.startswith("emulated/"):
        spec = label.removeprefix("emulated/").replace(":output=fp16", "")
        for long, short in (("sequential", "seq"), ("pairwise", "pair"), ("blocked", "blk"), ("chunked", "chunk")):
            spec = spec.replace(long, short)
        return "emu " + spec
    return label


def _matches_from_frame(frame) -> dict:
    matches: dict = {}
    for row in frame.itertuples(index=False):
        entry = matches.setdefault(row.configuration, {}).setdefault(
            row.op, {"status": row.status, "summary": {"fractions": {}}})
        if row.property == "best_model":
            entry["summary"]["best"] = row.value
        elif row.property.startswith("match_fraction_k"):
            entry["summary"]["fractions"][int(row.property.removeprefix("match_fraction_k"))] = float(row.value)
    return matches
