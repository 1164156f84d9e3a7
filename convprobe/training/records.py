"""Run records streamed to disk: a JSON header with provenance, two CSV files.

Layout of a run directory:

- `header.json`: provenance (`convprobe.provenance.collect`), the run's
  configuration, the runtime facts (XLA flags, devices, the fp16-rounding check),
  the column schema and the histogram bin labels; rewritten on resume with the
  resume points appended.
- `steps.csv`: one row per step (loss, accuracy, loss scale, finite, skipped,
  throughput), appended and flushed as the run goes.
- `telemetry.csv`: one row per recorded step x tensor (layer, kind
  weight/activation, counts, fractions, extremes, histograms).
- `checkpoint.npz`: weights, optimizer state and the next step; written
  atomically. `summary.json` at the end.

An interrupted run keeps every row written so far. Resuming drops rows after
the last checkpoint (those steps are recomputed, with the same batches).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np

from convprobe import provenance
from convprobe.render import write_atomic
from convprobe.errors import InvalidArgument
from convprobe.training.telemetry import COUNT_FIELDS, histogram_edges

__all__ = [
    "STEP_COLUMNS",
    "TELEMETRY_COLUMNS",
    "RunFiles",
    "read_header",
    "save_checkpoint",
    "load_checkpoint",
]

STEP_COLUMNS = (
    "step", "loss", "accuracy", "loss_scale", "finite", "skipped", "telemetry",
    "step_seconds", "images_per_second",
)
TELEMETRY_COLUMNS = (
    "step", "loss_scale", "kind", "index", "layer", *COUNT_FIELDS,
    "routing_zero_fraction", "flushed_fraction", "lost_fraction", "subnormal_fraction", "class_mismatch_fraction",
    "shadow_underflow_fraction", "min_abs", "max_abs", "hist_low", "hist_shadow",
)

#: Configuration fields that may change between an interrupted run and its resumption.
_RESUMABLE_CHANGES = {"steps", "progress", "output", "checkpoint_every", "eval_batches"}


def read_header(directory: str | Path) -> dict:
    return json.loads((Path(directory) / "header.json").read_text(encoding="utf-8"))


def _truncate_csv(path: Path, keep_below_step: int) -> None:
    """Keep the header and the rows whose step is below `keep_below_step`."""
    if not path.exists():
        return
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        return
    kept = [rows[0]] + [r for r in rows[1:] if r and int(r[0]) < keep_below_step]
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(kept)
    os.replace(tmp, path)


class RunFiles:
    """The files of one run directory; opens the CSVs for appending."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.header_path = self.directory / "header.json"
        self.steps_path = self.directory / "steps.csv"
        self.telemetry_path = self.directory / "telemetry.csv"
        self.checkpoint_path = self.directory / "checkpoint.npz"
        self.summary_path = self.directory / "summary.json"
        self._steps = self._telemetry = None

    # -- lifecycle ---------------------------------------------------------------
    def start(self, config_json: dict, *, seed: int, device: str, runtime: dict,
              layer_names: dict) -> int:
        """Create or reopen the directory; returns the step to start from."""
        self.directory.mkdir(parents=True, exist_ok=True)
        start_step = 0
        resumed: list = []
        if self.header_path.exists():
            old = read_header(self.directory)
            old_config = old.get("config", {})
            for key, value in config_json.items():
                if key in _RESUMABLE_CHANGES:
                    continue
                if old_config.get(key) != value:
                    raise InvalidArgument(
                        f"output '{self.directory}' holds a run with a different {key} "
                        f"({old_config.get(key)!r}, now {value!r}); use a new --output directory"
                    )
            resumed = old.get("resumed_at_steps", [])
            if self.checkpoint_path.exists():
                with np.load(self.checkpoint_path) as ckpt:
                    start_step = int(ckpt["next_step"])
            resumed = resumed + [start_step]
        header = {
            "provenance": provenance.collect(seed=seed, device=device, extra={"runtime": runtime}),
            "config": config_json,
            "resumed_at_steps": resumed,
            "columns": {"steps": list(STEP_COLUMNS), "telemetry": list(TELEMETRY_COLUMNS)},
            "histogram_bins": histogram_edges(),
            "histogram_note": (
                "hist_* cells are 'e:count' pairs; e is floor(log2|g|) of the scaled gradient; "
                f"e={histogram_edges()[0]} collects everything smaller, e={histogram_edges()[-1]} "
                "everything at or above 2^e"
            ),
            "layers": layer_names,
        }
        write_atomic(str(self.header_path), json.dumps(header, indent=2, sort_keys=True, default=str))
        _truncate_csv(self.steps_path, start_step)
        _truncate_csv(self.telemetry_path, start_step)
        self._steps = self._open(self.steps_path, STEP_COLUMNS)
        self._telemetry = self._open(self.telemetry_path, TELEMETRY_COLUMNS)
        return start_step

    @staticmethod
    def _open(path: Path, columns):
        new = not path.exists() or path.stat().st_size == 0
        handle = path.open("a", newline="", encoding="utf-8")
        writer = csv.writer(handle)
        if new:
            writer.writerow(columns)
            handle.flush()
        return handle, writer

    def write_step(self, row: dict) -> None:
        handle, writer = self._steps
        writer.writerow([row[c] for c in STEP_COLUMNS])
        handle.flush()

    def write_telemetry(self, rows: list[dict]) -> None:
        handle, writer = self._telemetry
        writer.writerows([[r[c] for c in TELEMETRY_COLUMNS] for r in rows])
        handle.flush()

    def finish(self, summary: dict) -> None:
        write_atomic(str(self.summary_path), json.dumps(summary, indent=2, sort_keys=True, default=str))
        self.close()

    def close(self) -> None:
        for item in (self._steps, self._telemetry):
            if item is not None:
                item[0].close()
        self._steps = self._telemetry = None


def save_checkpoint(path: Path, next_step: int, weights: list[np.ndarray],
                    optimizer_state: list[np.ndarray], counters: dict) -> None:
    """Write weights + optimizer state + next step atomically."""
    arrays = {f"w{i}": w for i, w in enumerate(weights)}
    arrays.update({f"o{i}": v for i, v in enumerate(optimizer_state)})
    arrays["next_step"] = np.array(next_step)
    arrays["counters"] = np.array(json.dumps(counters))
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> tuple[int, list[np.ndarray], list[np.ndarray], dict]:
    with np.load(path) as ckpt:
        weights = [ckpt[f"w{i}"] for i in range(sum(k.startswith("w") for k in ckpt.files))]
        opt = [ckpt[f"o{i}"] for i in range(sum(k.startswith("o") for k in ckpt.files))]
        return int(ckpt["next_step"]), weights, opt, json.loads(str(ckpt["counters"]))
