"""`convprobe report`'s library: read any result, validate it completely, draw its figures.

A result is a JSON envelope of any kind (`convprobe.results`), a tidy CSV or JSON
table of the analysis schemas, a training run directory (its header.json and
CSVs), or a training comparison's directory (`convprobe train --arm ...` or
`--compare-loss-scaling`: its comparison.json, drawn as a table of mean ± std accuracy
per arm and a figure of every run's accuracy). `draw` loads and checks every
input and builds every figure before it writes a single file: a malformed input is
one InvalidArgument line naming the file and the field, and nothing is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from convprobe import files, results
from convprobe.analysis import figures
from convprobe.analysis.tables import (
    FINGERPRINT_TITLES,
    check_values,
    fingerprint_table,
    read_csv,
    read_table,
    validate_frame,
)
from convprobe.errors import InvalidArgument
from convprobe.options import FigureFormat, Status, parse_option

__all__ = ["Loaded", "load", "figures_for", "draw", "short_label"]

#: Cell colours of the fingerprint table figure beyond `figures.DEFAULT_HIGHLIGHT`.
FINGERPRINT_HIGHLIGHT = {
    "fp16, products to 11 bits": "#f9b98a", "11": "#fcd5b4", "24": "#c6dbef", ">=39": "#9ecae1",
    "exact/wide": "#9ecae1", "inf (fp16 fused chain)": "#fcd5b4", "NaN (fp16 products)": "#f9b98a",
    "0 (wide or fused)": "#c6dbef", "fp32, products to 11 bits": "#e3d7f0",
}
#: A contract's verdicts: a declaration not kept stands out.
CONTRACT_HIGHLIGHT = {"NOT HONOURED": "#f9b98a", "honoured": "#c6dbef"}
#: The columns of a contract's table figure.
_CONTRACT_COLUMNS = ["configuration", "switches", "op", "declared", "observed", "verdict"]

#: What each column of a run's CSVs that the figures read must hold (`tables.VALUE_RULES`).
_RUN_VALUES = {"steps": {"step": "count", "loss": "number", "loss_scale": "positive", "skipped": "bool"},
               "telemetry": {"step": "count", "kind": "kind", "index": "count", "flushed_fraction": "fraction",
                             "subnormal_fraction": "fraction"}}


@dataclass
class Loaded:
    """One validated input: its kind, the envelope (None for a bare table), the tidy frame
    (tables), or a training run's steps and telemetry."""

    name: str
    kind: str
    document: dict | None = None
    frame: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    telemetry: pd.DataFrame | None = None


def load(path: str) -> list[Loaded]:
    """Every result `path` holds (a comparison directory holds several runs), validated."""
    if not str(path):  # Path("") is the working directory
        raise InvalidArgument("results must name files or directories; received ''")
    p = Path(path)
    if os.path.isdir(p):  # False, not an OSError, for a name too long or with a NUL byte: named below
        if os.path.lexists(p / "header.json"):  # a header that is a directory or a link loop is named by results.read
            return [_load_run(p)]
        if os.path.lexists(p / results.COMPARISON_FILE):  # a training comparison: its document, not its runs one by one
            document = results.read(p / results.COMPARISON_FILE, kinds=(results.Kind.TRAIN_COMPARISON,))
            return [Loaded(p.name, document["kind"], document)]
        runs = sorted(d for d in p.iterdir() if os.path.lexists(d / "header.json"))
        if not runs:
            raise InvalidArgument(f"{path} is a directory without a training run (no header.json in it or "
                                  f"its subdirectories)")
        return [_load_run(d, name=f"{p.name}-{d.name}") for d in runs]
    where = f"results file {path!r}"
    results.regular_file(p, where=where)
    suffix = p.suffix.lower()
    if suffix == ".csv":
        columns = list(read_csv(p, where=where).columns)
        return [_table(p, "sweep" if "distribution" in columns else "probe")]
    if suffix != ".json":
        raise InvalidArgument(f"results file {p.name} must be .json, .csv or a run directory; received "
                              f"{suffix or 'no suffix'}")
    raw = results.read_json(p, where=where)
    if isinstance(raw, dict) and "rows" in raw and "schema" in raw and "kind" not in raw:  # a bare table
        schema = raw["schema"]
        if schema not in ("sweep", "probe"):
            raise InvalidArgument(f"results file {p.name}: schema must be one of sweep, probe; received "
                                  f"{results.show(schema)}")
        return [_table(p, schema)]
    document = results.validate(results.upgrade(raw, where=path), where=path)
    if document["kind"] in (results.Kind.TRAIN, results.Kind.TRAIN_SUMMARY):
        return [_load_run(p.parent)]
    frame = None
    if "table" in document:  # validated with the envelope; typed here for the figures
        frame = validate_frame(pd.DataFrame(document["table"]["rows"]), document["table"]["schema"], where=path)
    return [Loaded(p.stem, document["kind"], document, frame)]


def _table(p: Path, schema: str) -> Loaded:
    frame = read_table(p, schema)
    if schema == "sweep":
        return Loaded(p.stem, "sweep", None, frame)
    probes = set(frame["probe"])
    for kind in ("fingerprint", "identify"):
        if probes <= {kind}:
            return Loaded(p.stem, kind, None, frame)
    raise InvalidArgument(f"results file {p.name} mixes probes {sorted(probes)}; report reads fingerprint or "
                          f"identify tables")


def _load_run(directory: Path, name: str | None = None) -> Loaded:
    """A training run: its header (validated envelope) and CSVs, their columns as the header says
    and the values the figures read checked (`_RUN_VALUES`)."""
    header = results.read(directory / "header.json", kinds=(results.Kind.TRAIN,))
    frames = {}
    for part in ("steps", "telemetry"):
        where = f"training run {directory}: {part}.csv"
        frame = read_csv(directory / f"{part}.csv", where=where)
        expected = header["columns"][part]
        if list(frame.columns) != expected:
            raise InvalidArgument(f"{where} has columns {list(frame.columns)[:4]}...; "
                                  f"header.json says {expected[:4]}...")
        check_values(frame, _RUN_VALUES[part], where=where)
        frames[part] = frame
    return Loaded(name or directory.name, "train", header, steps=frames["steps"], telemetry=frames["telemetry"])


# -- figures -----------------------------------------------------------------------------


def figures_for(item: Loaded):
    """(name, Figure) pairs for one validated input."""
    kind, document, frame = item.kind, item.document, item.frame
    if kind in ("overflow", "compare"):
        assert document is not None  # (`load`: an envelope's kinds come with their document)
        yield from _classic_figures(kind, document)
    elif kind == results.Kind.TRAIN_COMPARISON:
        assert document is not None
        yield from _comparison_figures(item.name, document)
    elif kind == "replay":
        assert document is not None
        yield "match", figures.replay_figure(document["results"])
    elif kind == "train":
        assert document is not None
        config = document["params"]
        yield "run", figures.training_run_figure(
            item.steps, item.telemetry,
            title=f"{item.name}: {config['dtype']}, loss scale {config['loss_scale']['mode']}")
    elif kind == "fingerprint":
        assert frame is not None  # (a fingerprint document's table is required: `results`)
        properties = [p for p in dict.fromkeys(frame["property"]) if p != "status"]
        wide = fingerprint_table(frame, properties or None).rename(columns=FINGERPRINT_TITLES)
        wide["configuration"] = wide["configuration"].str.replace("tensorflow/", "tf/", regex=False)
        yield "table", figures.table_figure(
            wide, title="Fingerprint: what each configuration and op really computes",
            highlight={**figures.DEFAULT_HIGHLIGHT, **FINGERPRINT_HIGHLIGHT}, max_rows=max(60, len(wide)))
    elif kind == results.Kind.CONTRACT:
        assert document is not None
        cells = pd.DataFrame(document["cells"], columns=_CONTRACT_COLUMNS).fillna("-")
        yield "table", figures.table_figure(
            cells, title="Precision contract: the accumulation each switch declares, and what the op does",
            highlight={**figures.DEFAULT_HIGHLIGHT, **CONTRACT_HIGHLIGHT}, max_rows=max(60, len(cells)))
    elif kind == "identify" and document is not None and "layers" in document["params"]:
        yield "layers", figures.layer_map_figure(document["matches"])
    elif kind == "identify":
        matches = document["matches"] if document is not None else _matches_from_frame(frame)
        for op in sorted({op for per_op in matches.values() for op in per_op}):
            yield f"match-{op}", figures.match_fraction_figure(matches, op)
    else:
        yield from _sweep_figures(document, frame)


#: Classes of every data source `convprobe train` reads (synthetic, digits, cifar10): chance is 1/10.
_TRAIN_CLASSES = 10


def _comparison_figures(name: str, document: dict):
    shared = document["params"].get("shared", {})
    what = ", ".join(f"{key} {Path(str(shared[key])).name if key in ('data', 'keras_model') else shared[key]}"
                     for key in ("keras_model", "data", "resnet_size", "steps", "batch_size", "eval_batches")
                     if shared.get(key) is not None)
    yield "table", figures.table_figure(
        figures.comparison_table(document["arms"]),
        title=f"{name}: final evaluation accuracy per arm, mean ± sample std (ddof = 1) over seeds "
              f"{', '.join(map(str, document['params']['seeds']))}")
    chance = None if shared.get("keras_model") else 1 / _TRAIN_CLASSES  # a user's model: its classes are its own
    yield "accuracy", figures.comparison_figure(document["runs"], document["arms"], chance=chance,
                                                title=f"{name}: final evaluation accuracy per arm\n({what})")


def _classic_figures(kind: str, document: dict):
    records = document["results"]
    rows = pd.DataFrame([{
        "configuration": r["config"]["label"].replace("tensorflow/", "tf/"), "requested": r.get("requested"),
        "status": r["status"], "accumulation": r["accumulation"] or "",
        "output": ", ".join(r["observed"].get("output", [])) if kind == "overflow" else "",
        "real_max_ulp": r["observed"].get("real", {}).get("max_ulp_error"),
        "fake_max_ulp": r["observed"].get("fake", {}).get("max_ulp_error"),
    } for r in records])
    columns = ["configuration", "requested", "status", "accumulation"] + (["output"] if kind == "overflow" else [])
    yield "table", figures.table_figure(rows[columns], title=f"{kind}: observed accumulation per configuration",
                                        max_rows=max(60, len(rows)))
    ok = rows[rows["status"] == Status.OK]
    if kind == "compare" and len(ok):
        yield "ulp", figures.compare_figure(ok)


def _sweep_figures(document: dict | None, frame: pd.DataFrame):
    ok = frame[frame["status"] == Status.OK].copy()
    ok["configuration"] = ok["configuration"].map(short_label)
    for op in dict.fromkeys(ok["op"]):
        for dist in dict.fromkeys(ok[ok["op"] == op]["distribution"]):
            part = ok[(ok["op"] == op) & (ok["distribution"] == dist)]
            yield f"error-vs-k-{op}-{dist}", figures.error_vs_k_figure(
                part, accumulators=("fp16", "fp32"), output="fp16", facet=None,
                title=f"{op}, {dist} inputs: worst error / Σ|x·w| versus K\n"
                      "(bounds for fp16 and fp32 accumulation, each + one fp16 output rounding)")
    if document is None:
        return
    per_op: dict[str, dict[str, list]] = {}
    largest = {}
    for label, ops in document["ulp_errors"].items():
        for op, dists in ops.items():
            entry = dists.get("uniform01")
            if entry:
                per_op.setdefault(op, {})[short_label(label)] = [float(v) for v in entry["ulp_errors"]]
                largest[op] = entry["k"]
    for op, series in per_op.items():
        if any(len(v) for v in series.values()):
            yield f"ulp-{op}", figures.ulp_histogram_figure(
                {k: v for k, v in series.items() if v}, "fp16",
                title=f"{op}: ULP errors at K = {largest[op]}, U[0,1) inputs")


def short_label(label: str) -> str:
    """'tensorflow/cpu/jit+strict' -> 'tf jit+strict'; 'emulated/sequential:fp32:output=fp16' -> 'emu seq:fp32'."""
    if label.startswith("tensorflow/"):
        return "tf " + label.split("/", 2)[-1]
    if label.startswith("emulated/"):
        spec = label.removeprefix("emulated/").replace(":output=fp16", "")
        for long, short in (("sequential", "seq"), ("pairwise", "pair"), ("blocked", "blk"), ("chunked", "chunk")):
            spec = spec.replace(long, short)
        return "emu " + spec
    return label


def _matches_from_frame(frame: pd.DataFrame) -> dict:
    matches: dict = {}
    for row in frame.itertuples(index=False):
        entry = matches.setdefault(row.configuration, {}).setdefault(
            row.op, {"status": row.status, "summary": {"fractions": {}}})
        if row.property == "best_model":
            entry["summary"]["best"] = row.value
        elif row.property.startswith("match_fraction_k"):
            entry["summary"]["fractions"][int(row.property.removeprefix("match_fraction_k"))] = float(row.value)
    return matches


# -- drawing -----------------------------------------------------------------------------


def check_formats(text: str) -> list[FigureFormat]:
    """`png,svg` -> [png, svg]; one line naming what is allowed otherwise."""
    names = [f.strip() for f in text.split(",") if f.strip()]
    if not names:
        raise InvalidArgument(f"formats must name at least one of {', '.join(FigureFormat)}; received {text!r}")
    return [parse_option("formats", name, FigureFormat) for name in names]


def draw(paths: list[str], out_dir: str, formats: list[FigureFormat]) -> list[str]:
    """Figures for every input into `out_dir`; returns the files written. Every input is
    validated and every figure built before anything is written."""
    loaded: list[Loaded] = []
    seen: dict[str, str] = {}
    for path in paths:
        for item in load(path):
            if seen.setdefault(item.name, path) != path:
                raise InvalidArgument(f"{seen[item.name]} and {path} would both write figures named "
                                      f"{item.name}-*: report them into different --out-dir folders")
            loaded.append(item)
    built = []
    for item in loaded:
        try:
            built += [(item.name, name, fig) for name, fig in figures_for(item)]
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as exc:
            # well-formed, yet not drawable
            raise InvalidArgument(f"results {item.name}: cannot be drawn ({exc.__class__.__name__}: "
                                  f"{results.reason(exc)})") from None
    target_dir = Path(out_dir)
    targets = [(target_dir / f"{stem}-{name}.{fmt}", fig, fmt) for stem, name, fig in built for fmt in formats]
    for target, _, _ in targets:  # a link, directory or device where a figure goes: refused before any is written
        files.check_output_path(str(target), "--out-dir")
    for target, fig, fmt in targets:
        files.save_figure(fig, target, dpi=150 if fmt == FigureFormat.PNG else None)  # never through a link
    return [str(target) for target, _, _ in targets]
