"""Run records streamed to disk: a JSON header with provenance, two CSV files.

Layout of a run directory:

- `header.json`: a `train` envelope (`convprobe.results`): provenance (`convprobe.provenance.collect`), the run's
  configuration, the runtime facts (XLA flags, devices, the fp16-rounding check),
  the column schema and the histogram bin labels; rewritten on resume with the
  resume points appended.
- `steps.csv`: one row per step (loss, accuracy, loss scale, finite, skipped,
  throughput), appended and flushed as the run goes.
- `telemetry.csv`: one row per recorded step x tensor (layer, kind
  weight/activation, counts, fractions, extremes, histograms).
- `checkpoint.npz`: weights, optimizer state and the next step; written
  atomically. `summary.json` (a `train-summary` envelope) at the end.

An interrupted run keeps every row written so far. Resuming drops rows after
the last checkpoint (those steps are recomputed, with the same batches) and rows
of the wrong width (a write cut short). Nothing is changed on disk until the
header and the checkpoint have been read and validated completely (`RunFiles.plan`,
which runs before TensorFlow is imported) and the checkpoint has been restored into
the model: a corrupt or foreign directory leaves every file as it was.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from convprobe import files, provenance, results
from convprobe.errors import InvalidArgument
from convprobe.training.telemetry import (
    COUNT_FIELDS,
    COUNTERFACTUAL_FIELDS,
    encode_histogram,
    histogram_edges,
)

__all__ = [
    "STEP_COLUMNS",
    "TELEMETRY_COLUMNS",
    "COLUMN_DEFINITIONS",
    "RunFiles",
    "ResumePlan",
    "RUN_FILE_NAMES",
    "RUN_DIRECTORY_NAMES",
    "TENSORBOARD_DIRECTORY",
    "TensorNames",
    "telemetry_rows",
    "nonfinite_fields",
    "claim_directory",
    "foreign_entries",
    "read_header",
    "read_summary",
    "IDENTIFY_MAP_NAME",
    "save_checkpoint",
    "load_checkpoint",
]

STEP_COLUMNS = (
    "step", "loss", "accuracy", "loss_scale", "finite", "skipped", "telemetry",
    "step_seconds", "images_per_second", "nonfinite_tensors", "first_nonfinite",
)
TELEMETRY_COLUMNS = (
    "step", "loss_scale", "kind", "index", "layer", "precision", "same_gradient_as", *COUNT_FIELDS,
    "routing_zero_fraction", "flushed_fraction", "lost_fraction", "underflow_fraction", "subnormal_fraction",
    "class_mismatch_fraction", "shadow_underflow_fraction",
    *(f"{field}_fraction" for field in COUNTERFACTUAL_FIELDS),
    "min_abs", "max_abs", "hist_low", "hist_shadow",
)

#: What each column holds (written into header.json and the README). S is the loss scale;
#: every magnitude is of the scaled gradient S*g, as the low-precision backward pass holds it.
COLUMN_DEFINITIONS = {
    "steps": {
        "step": "step index, from 0",
        "loss": "mean cross-entropy over the global batch (unscaled)",
        "accuracy": "share of the global batch classified correctly, before the update",
        "loss_scale": "S used in this step",
        "finite": "every weight gradient finite on every replica",
        "skipped": "the update was skipped because a gradient was not finite (static or dynamic scaling)",
        "telemetry": "this step recorded telemetry rows",
        "step_seconds": "wall time of the step",
        "images_per_second": "global batch / step_seconds",
        "nonfinite_tensors": "on a step with non-finite gradients, the tensors whose gradients held inf or NaN "
                             "('kind:name', ';'-separated, in backward-pass order; activations only on telemetry "
                             "steps); empty otherwise",
        "first_nonfinite": "the first of nonfinite_tensors in the backward pass (nearest the output): where the "
                           "overflow started; empty on a finite step",
    },
    "telemetry": {
        "step": "step index", "loss_scale": "S of that step",
        "kind": "weight (gradient of a trainable variable) or activation (gradient of a layer output)",
        "index": "position among tensors of its kind, input to output", "layer": "variable path or layer name",
        "precision": "format the gradient is computed in: the compute dtype, or fp32 for batch-norm "
                     "parameters (computed in fp32 under mixed precision: they cannot flush)",
        "same_gradient_as": "for a tap whose gradient is another tap's tensor (a block's conv2, its add, "
                            "its projection), that tap's name: its counts repeat it; empty otherwise",
        "n": "elements counted (weights: pooled over replicas, each replica's local gradient)",
        "routing_zero": "zero in both the low-precision gradient and its fp32 shadow (ReLU/pooling routing)",
        "flushed": "zero, while the fp32 shadow |S*g| is nonzero and at most half the smallest subnormal "
                   "(2^-25 for fp16): rounded to zero",
        "lost": "zero, while the shadow value is representable (an upstream flush or cancellation)",
        "subnormal": "|S*g| in [smallest subnormal, smallest normal) (2^-24 .. 2^-14 for fp16)",
        "inf": "infinite elements", "nan": "NaN elements",
        "shadow_underflow": "shadow |S*g| nonzero and at most half the smallest subnormal",
        "shadow_subnormal": "shadow |S*g| in the subnormal range",
        "class_mismatch": "range class (zero, subnormal, normal, non-finite) differs from the shadow's",
        "routing_zero_fraction": "routing_zero / n", "flushed_fraction": "flushed / n", "lost_fraction": "lost / n",
        "underflow_fraction": "(flushed + lost) / n: zero in low precision, nonzero in fp32 (underflow "
                              "as a user means it)",
        "subnormal_fraction": "subnormal / n", "class_mismatch_fraction": "class_mismatch / n",
        "shadow_underflow_fraction": "shadow_underflow / n",
        "bf16_flushed_fraction": "share of the fp32 shadow values |S*g| that would flush to zero in bf16 at this S "
                                "(from the shadow, no second run)",
        "bf16_subnormal_fraction": "share of the fp32 shadow values |S*g| that would land subnormal in bf16 at this S "
                                "(from the shadow, no second run)",
        "fp8_e4m3_flushed_fraction": "share of the fp32 shadow values |S*g| that would flush to zero in fp8_e4m3 at this S "
                                "(from the shadow, no second run)",
        "fp8_e4m3_subnormal_fraction": "share of the fp32 shadow values |S*g| that would land subnormal in fp8_e4m3 at this S "
                                "(from the shadow, no second run)",
        "fp8_e5m2_flushed_fraction": "share of the fp32 shadow values |S*g| that would flush to zero in fp8_e5m2 at this S "
                                "(from the shadow, no second run)",
        "fp8_e5m2_subnormal_fraction": "share of the fp32 shadow values |S*g| that would land subnormal in fp8_e5m2 at this S "
                                "(from the shadow, no second run)",
        "min_abs": "smallest nonzero |S*g|", "max_abs": "largest finite |S*g|",
        "hist_low": "log2-magnitude histogram of the low-precision |S*g| (see histogram_note)",
        "hist_shadow": "the same for the fp32 shadow",
    },
}
assert all(set(COLUMN_DEFINITIONS[k]) == set(cols) for k, cols in (("steps", STEP_COLUMNS),
                                                                  ("telemetry", TELEMETRY_COLUMNS)))

#: Configuration fields that may change between an interrupted run and its resumption.
_RESUMABLE_CHANGES = {"steps", "progress", "output", "checkpoint_every", "eval_batches"}


def read_header(directory: str | Path) -> dict:
    """The run's header.json (a `train` envelope, `convprobe.results`), validated; one
    InvalidArgument line if it is unreadable, malformed or of another kind."""
    path = Path(directory) / "header.json"
    return _read_record(path, results.Kind.TRAIN)


def _read_record(path: Path, kind: str) -> dict:
    try:
        return results.read(path, kinds=(kind,))
    except InvalidArgument as exc:
        raise InvalidArgument(f"{exc}; nothing was changed: use a new --output directory") from None


def read_summary(directory: str | Path) -> dict:
    """A finished run's summary (the `summary` of its `train-summary` envelope), validated."""
    return _read_record(Path(directory) / "summary.json", results.Kind.TRAIN_SUMMARY)["summary"]


def _step_of(row: list[str], width: int) -> int | None:
    """The step of a well-formed CSV row, None for a malformed one."""
    if len(row) != width:
        return None
    try:
        return int(row[0])
    except ValueError:
        return None


def _kept_rows(path: Path, keep_below_step: int, columns) -> list[list[str]] | None:
    """The header and the well-formed rows of a CSV whose step is below `keep_below_step`
    (None if the file does not exist); an unreadable file is one InvalidArgument line."""
    if not path.exists():
        return None
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidArgument(f"{path} is not a readable convprobe record ({exc.__class__.__name__}); "
                              f"nothing was changed: use a new --output directory") from None
    if not rows:
        return []
    return [rows[0]] + [r for r in rows[1:]
                        if (step := _step_of(r, len(columns))) is not None and step < keep_below_step]


def _rewrite_csv(path: Path, rows: list[list[str]] | None) -> None:
    """Replace `path` by `rows` atomically (nothing to do for a file that did not exist)."""
    if not rows:
        return
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(rows)
    files.write_atomic(path, buffer.getvalue())


def _truncate_csv(path: Path, keep_below_step: int, columns) -> None:
    """Keep the header and the well-formed rows whose step is below `keep_below_step`."""
    _rewrite_csv(path, _kept_rows(path, keep_below_step, columns))


#: The names convprobe writes in a run directory; nothing else there is ever touched.
#: The twin's identify map, measured before the run, kept beside its records.
IDENTIFY_MAP_NAME = "identify.json"
#: TensorBoard event files (`convprobe.training.tensorboard`), a directory of the run's own.
TENSORBOARD_DIRECTORY = "tensorboard"
RUN_FILE_NAMES = ("header.json", "steps.csv", "telemetry.csv", "checkpoint.npz", "summary.json", IDENTIFY_MAP_NAME,
                  files.LOCK_NAME)
#: The directories convprobe writes in a run directory (never a link or a file of a user's).
RUN_DIRECTORY_NAMES = (TENSORBOARD_DIRECTORY,)


@dataclass(frozen=True)
class TensorNames:
    """The recorded tensors of a model, weights then activations, as their rows name them."""

    weights: list
    activations: list
    precision: list  # per tensor: the format its gradient is computed in
    same_gradient_as: list  # per tensor: the tap whose tensor it repeats, or ""

    @property
    def rows(self) -> list[tuple[str, int, str]]:
        """(kind, index, name) per tensor."""
        return [("weight", i, n) for i, n in enumerate(self.weights)] + \
               [("activation", i, n) for i, n in enumerate(self.activations)]


def telemetry_rows(step: int, loss_scale: float, names: TensorNames, stats: dict) -> list[dict]:
    """One telemetry.csv record per tensor of a telemetry step, from the statistics of
    `telemetry.batched_stats` (NumPy arrays, one row
    per tensor of `names`: "counts", "min_abs", "max_abs", "hist_low", "hist_shadow",
    "counterfactual"). `convprobe train` and the Keras callback both write through here."""
    rows = []
    for t, (kind, index, name) in enumerate(names.rows):
        c = dict(zip(COUNT_FIELDS, (int(x) for x in stats["counts"][t])))
        n = max(c["n"], 1)
        counterfactual = {f"{field}_fraction": int(x) / n
                          for field, x in zip(COUNTERFACTUAL_FIELDS, stats["counterfactual"][t])}
        rows.append({
            "step": step, "loss_scale": loss_scale, "kind": kind,
            "index": index, "layer": name, "precision": names.precision[t],
            "same_gradient_as": names.same_gradient_as[t], **c,
            "routing_zero_fraction": c["routing_zero"] / n,
            "flushed_fraction": c["flushed"] / n,
            "lost_fraction": c["lost"] / n,
            "underflow_fraction": (c["flushed"] + c["lost"]) / n,
            "subnormal_fraction": c["subnormal"] / n,
            "class_mismatch_fraction": c["class_mismatch"] / n,
            "shadow_underflow_fraction": c["shadow_underflow"] / n,
            **counterfactual,
            "min_abs": float(stats["min_abs"][t]), "max_abs": float(stats["max_abs"][t]),
            "hist_low": encode_histogram(stats["hist_low"][t]),
            "hist_shadow": encode_histogram(stats["hist_shadow"][t]),
        })
    return rows


def nonfinite_fields(names: TensorNames, nonfinite, order, *, measured=None) -> dict:
    """The steps.csv fields nonfinite_tensors and first_nonfinite: the tensors whose
    `nonfinite` count is positive, in backward-pass `order` (`telemetry.backward_order`);
    `measured` (a count per tensor, default all) leaves out tensors not measured this step."""
    labels = [f"{kind}:{name}" for kind, _, name in names.rows]
    bad = [labels[k] for k in order if k < len(nonfinite) and int(nonfinite[k]) > 0
           and (measured is None or measured[k])]
    return {"nonfinite_tensors": ";".join(bad), "first_nonfinite": bad[0] if bad else ""}


def _setting(value) -> str:
    """A recorded setting as a message shows it: a loss scale by its mode and scale, JSON else."""
    if isinstance(value, dict) and set(value) >= {"mode", "scale"}:
        return str(value["mode"]) if value["mode"] in ("none", "dynamic") else f"{value['mode']} {value['scale']:g}"
    return json.dumps(value)


def refuse_foreign_directories(directory: Path, names, *, argument: str = "--output") -> None:
    """Refuse a directory whose own subdirectories `names` are links or files: convprobe writes
    its event files only into a directory of its own."""
    for name in names:
        path = directory / name
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise InvalidArgument(f"{argument} {str(directory)!r}: {name} is {'a symbolic link' if path.is_symlink() else 'a file'}; "
                                  f"convprobe writes its runs only into directories of its own; nothing was changed: "
                                  f"use a new directory")


def foreign_entries(directory: Path, own_names) -> list[str]:
    """The entries of `directory` that convprobe did not write: neither one of `own_names` nor
    its lock or a temporary file of `convprobe.files` left by a killed run."""
    own = {*own_names, files.LOCK_NAME}
    return sorted(entry.name for entry in directory.iterdir()
                  if entry.name not in own and not entry.name.startswith(files.TEMPORARY_PREFIX))


def claim_directory(directory: Path, own_names, *, recorded: bool, what: str = "a convprobe run",
                    own_directories=(), argument: str = "--output") -> None:
    """Refuse, changing nothing, a directory that holds files convprobe did not write, or whose
    own files are links or not regular files, or whose own subdirectories (`own_directories`)
    are links or files: a user's directory is never adopted, overwritten or appended to.
    The own names count as convprobe's only where `recorded` (a run's header is there): a
    user's own steps.csv in a directory without one is theirs."""
    files.check_directory_path(str(directory), argument)
    if not directory.is_dir():
        return
    files.refuse_links(directory, own_names, argument=argument)
    refuse_foreign_directories(directory, own_directories, argument=argument)
    foreign = foreign_entries(directory, (*own_names, *own_directories) if recorded else ())
    if foreign:
        shown = ", ".join(repr(name) for name in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise InvalidArgument(f"{argument} {str(directory)!r} holds files that are not {what} ({shown}); nothing "
                              f"was changed: use an empty or new directory")


class RunFiles:
    """The files of one run directory; opens the CSVs for appending."""

    def __init__(self, directory: str | Path, *, argument: str = "--output"):
        self.directory = Path(directory)
        self.argument = argument  # how messages name the directory: the option or keyword that gave it
        self.header_path = self.directory / "header.json"
        self.steps_path = self.directory / "steps.csv"
        self.telemetry_path = self.directory / "telemetry.csv"
        self.checkpoint_path = self.directory / "checkpoint.npz"
        self.summary_path = self.directory / "summary.json"
        self.tensorboard_path = self.directory / TENSORBOARD_DIRECTORY
        # (handle, csv writer) of each CSV while the run writes them (`start`), else None
        self._steps: tuple[TextIO, Any] | None = None
        self._telemetry: tuple[TextIO, Any] | None = None
        self._identity: dict = {}

    # -- lifecycle ---------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run directory's lock (created if need be) while the run writes: a second
        run on the same directory is refused before it changes anything."""
        self._claim()
        with files.directory_lock(self.directory, argument=self.argument):
            yield

    def _claim(self) -> None:
        """The directory is new, empty, or convprobe's own; none of its files is a link."""
        if self.header_path.is_file():  # a recorded run: files a user put beside it are left alone
            files.check_directory_path(str(self.directory), self.argument)
            files.refuse_links(self.directory, RUN_FILE_NAMES, argument=self.argument)
            refuse_foreign_directories(self.directory, RUN_DIRECTORY_NAMES, argument=self.argument)
            read_header(self.directory)  # a user's own header.json is refused before anything is written
        else:
            claim_directory(self.directory, RUN_FILE_NAMES, recorded=False, argument=self.argument)

    def plan(self, config_json: dict) -> "ResumePlan":
        """Read and validate what the directory holds, changing nothing: a new run, or a
        resume from the checkpoint (loaded here), or a finished run."""
        self._claim()  # without a header, a checkpoint (or anything but a lock) is refused there
        if not self.header_path.exists():
            return ResumePlan(0, [])
        old = read_header(self.directory)
        old_config = old["params"]
        for key, value in config_json.items():
            if key in _RESUMABLE_CHANGES:
                continue
            if old_config.get(key) != value:
                raise InvalidArgument(
                    f"{self.argument} '{self.directory}' holds a run with a different {key} "
                    f"({_setting(old_config.get(key))} there, {_setting(value)} now); nothing was changed: "
                    f"resume it with the same settings, or use a new {self.argument} directory"
                )
        recorded = old["columns"]
        if recorded != {"steps": list(STEP_COLUMNS), "telemetry": list(TELEMETRY_COLUMNS)}:
            raise InvalidArgument(f"{self.directory} was recorded with other columns (an older convprobe); "
                                  f"nothing was changed: resume it with that version or use a new --output")
        resumed = list(old.get("resumed_at_steps", []))
        state = load_checkpoint(self.checkpoint_path) if self.checkpoint_path.exists() else None
        start = state[0] if state is not None else 0
        steps = config_json.get("steps")
        if isinstance(steps, int) and start > steps:
            raise InvalidArgument(f"--steps {steps} is fewer than the {start} steps {str(self.directory)!r} already "
                                  f"holds; nothing was changed: pass --steps {start} or more to resume or report "
                                  f"it, or use a new --output directory")
        rows = {"steps": _kept_rows(self.steps_path, start, STEP_COLUMNS),  # read now: fail now
                "telemetry": _kept_rows(self.telemetry_path, start, TELEMETRY_COLUMNS)}
        replicas = old["provenance"].get("runtime", {}).get("replicas")
        return ResumePlan(start, resumed + [start], state, rows, replicas if isinstance(replicas, int) else None)

    def start(self, plan: "ResumePlan", *, config_json: dict, seed: int, device: str, runtime: dict,
              layer_names: dict, arithmetic: dict | None = None) -> int:
        """Write the header and drop the rows the resume recomputes; returns the first step.
        Call only after the plan's checkpoint has been restored into the model."""
        self.directory.mkdir(parents=True, exist_ok=True)
        start_step, resumed = plan.start_step, plan.resumed
        self._identity = {"params": config_json, "seed": seed, "device": device}
        header = results.envelope(
            results.Kind.TRAIN, config_json,
            provenance.collect(seed=seed, device=device, extra={"runtime": runtime}),
            resumed_at_steps=resumed,
            columns={"steps": list(STEP_COLUMNS), "telemetry": list(TELEMETRY_COLUMNS)},
            column_definitions=COLUMN_DEFINITIONS,
            histogram_bins=histogram_edges(),
            histogram_note=(
                "hist_* cells are 'e:count' pairs; e is floor(log2|g|) of the scaled gradient; "
                f"e={histogram_edges()[0]} collects everything smaller, e={histogram_edges()[-1]} "
                "everything at or above 2^e"
            ),
            layers=layer_names,
            **({} if arithmetic is None else {"arithmetic": arithmetic}),
        )
        results.write(self.header_path, header)
        self.summary_path.unlink(missing_ok=True)  # a run extended past its end is not finished any more
        _rewrite_csv(self.steps_path, plan.rows.get("steps"))
        _rewrite_csv(self.telemetry_path, plan.rows.get("telemetry"))
        self._steps = self._open(self.steps_path, STEP_COLUMNS)
        self._telemetry = self._open(self.telemetry_path, TELEMETRY_COLUMNS)
        return start_step

    @staticmethod
    def _open(path: Path, columns) -> tuple[TextIO, Any]:
        handle = files.open_append(path)
        writer = csv.writer(handle)
        if handle.tell() == 0:
            with files.failures_as_one_line(path):
                writer.writerow(columns)
                handle.flush()
        return handle, writer

    def write_step(self, row: dict) -> None:
        if self._steps is None:
            raise RuntimeError("steps.csv is not open: start the run first (or it was closed)")
        handle, writer = self._steps
        with files.failures_as_one_line(self.steps_path):
            writer.writerow([row[c] for c in STEP_COLUMNS])
            handle.flush()

    def write_telemetry(self, rows: list[dict]) -> None:
        if self._telemetry is None:
            raise RuntimeError("telemetry.csv is not open: start the run first (or it was closed)")
        handle, writer = self._telemetry
        with files.failures_as_one_line(self.telemetry_path):
            writer.writerows([[r[c] for c in TELEMETRY_COLUMNS] for r in rows])
            handle.flush()

    def finish(self, summary: dict) -> None:
        """Write summary.json (a `train-summary` envelope) and close the CSVs."""
        identity = self._identity
        results.write(self.summary_path, results.envelope(
            results.Kind.TRAIN_SUMMARY, identity["params"],
            provenance.collect(seed=identity["seed"], device=identity["device"]), summary=summary))
        self.close()

    def close(self) -> None:
        for item in (self._steps, self._telemetry):
            if item is not None:
                try:
                    item[0].close()
                except OSError:  # every row was flushed as it was written; nothing is lost here
                    pass
        self._steps = self._telemetry = None


def save_checkpoint(path: Path, next_step: int, weights: list[np.ndarray],
                    optimizer_state: list[np.ndarray], counters: dict) -> None:
    """Write weights + optimizer state + next step atomically."""
    arrays: dict[str, Any] = {f"w{i}": w for i, w in enumerate(weights)}
    arrays.update({f"o{i}": v for i, v in enumerate(optimizer_state)})
    arrays["next_step"] = np.array(next_step)
    arrays["counters"] = np.array(json.dumps(counters))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    files.write_atomic(path, buffer.getvalue())  # never through a link planted at the name


@dataclass(frozen=True)
class ResumePlan:
    """What a run directory holds: the step to start from, the resume history, and the
    checkpoint (next step, weights, optimizer state, counters) when resuming."""

    start_step: int
    resumed: list
    checkpoint: tuple | None = None
    rows: dict = field(default_factory=dict)  # the CSV rows a resume keeps, read and checked
    replicas: int | None = None  # how many replicas the recorded run had (None: not recorded)


def load_checkpoint(path: Path) -> tuple[int, list[np.ndarray], list[np.ndarray], dict]:
    """(next step, weights, optimizer state, counters), every part validated; a corrupt or
    foreign file is one InvalidArgument line, not a traceback."""
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"{path} is not a usable convprobe checkpoint ({why}); nothing was "
                               f"changed: use a new --output directory")

    try:
        with open(path, "rb") as handle, np.load(handle, allow_pickle=False) as ckpt:
            files = set(ckpt.files)
            nw = sum(k.startswith("w") for k in files)
            no = sum(k.startswith("o") for k in files)
            expected = {f"w{i}" for i in range(nw)} | {f"o{i}" for i in range(no)} | {"next_step", "counters"}
            if files != expected:
                raise bad(f"arrays {sorted(files ^ expected)[:3]} missing or unexpected")
            weights = [ckpt[f"w{i}"] for i in range(nw)]
            opt = [ckpt[f"o{i}"] for i in range(no)]
            step, counters_text = ckpt["next_step"], ckpt["counters"]
    except InvalidArgument:
        raise
    except Exception as exc:  # zip, format or pickle errors of a damaged file
        raise bad(exc.__class__.__name__) from None
    if step.shape != () or step.dtype.kind not in "iu" or int(step) < 1:
        raise bad(f"next_step must be a positive integer; found {step!r}")
    try:
        counters = json.loads(str(counters_text))
    except json.JSONDecodeError:
        counters = None
    if not isinstance(counters, dict) or set(counters) != {"skipped", "nonfinite"} or not all(
            isinstance(v, int) and v >= 0 for v in counters.values()):
        raise bad("counters must be a JSON object of skipped and nonfinite step counts")
    if not weights:
        raise bad("it holds no weights")
    return int(step), weights, opt, counters
