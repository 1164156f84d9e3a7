"""Telemetry as TensorBoard event files, from the same records the CSVs hold.

Written with `tf.summary.write` and the scalar and histogram plugins' metadata,
so TensorBoard need not be installed to write them (`tf.summary.scalar` and
`histogram` are TensorBoard's code and refuse without it). Tags, per recorded
tensor (`kind` weight or activation, `layer` its variable path or layer name):

- `underflow/<kind>/<layer>/{flushed,lost,subnormal}_fraction`: scalars;
- `log2_abs_grad/<kind>/<layer>` and `log2_abs_grad_shadow/<kind>/<layer>`:
  histograms of floor(log2|S*g|) (one bucket per binade; the first and last
  buckets collect everything beyond `telemetry`'s range);
- `format/log2_smallest_subnormal`, `format/log2_smallest_normal`: the run
  format's ranges on the same axis, to read the histograms against;
- `loss_scale` and `skipped_steps` (cumulative) every step.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from convprobe.formats import Format
from convprobe.training.telemetry import decode_histogram

__all__ = ["TensorBoardWriter", "SCALAR_FIELDS"]

#: The per-tensor fractions written as scalars.
SCALAR_FIELDS = ("flushed_fraction", "lost_fraction", "subnormal_fraction")

_HISTOGRAM_NOTE = ("floor(log2|S*g|) of the scaled gradient, one bucket per binade; read against "
                   "format/log2_smallest_subnormal and format/log2_smallest_normal")


class TensorBoardWriter:
    """One event-file writer in `directory` (created); `write_*` take the CSV records."""

    def __init__(self, directory: str | Path, fmt: Format):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self.tf = tf
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.writer = tf.summary.create_file_writer(str(directory))
        self.format = fmt

        def metadata(plugin: str, description: str = "") -> bytes:
            m = summary_pb2.SummaryMetadata(summary_description=description)
            m.plugin_data.plugin_name = plugin
            return m.SerializeToString()

        self._scalar = metadata("scalars")
        self._histogram = metadata("histograms", _HISTOGRAM_NOTE)

    def _write_scalar(self, tag: str, value: float, step: int) -> None:
        self.tf.summary.write(tag, self.tf.constant(float(value), self.tf.float32), step=step, metadata=self._scalar)

    def _write_histogram(self, tag: str, cell: str, step: int) -> None:
        counts = decode_histogram(cell)
        if not counts:
            return
        # Plugin layout: [k, 3] float64 rows of (left edge, right edge, count).
        table = np.array([[e, e + 1, c] for e, c in sorted(counts.items())], dtype=np.float64)
        self.tf.summary.write(tag, self.tf.constant(table), step=step, metadata=self._histogram)

    def write_records(self, step: int, rows: list[dict]) -> None:
        """The scalars and histograms of one telemetry step's records."""
        with self.writer.as_default():
            self._write_scalar("format/log2_smallest_subnormal", math.log2(self.format.smallest_subnormal), step)
            self._write_scalar("format/log2_smallest_normal", math.log2(self.format.tiny), step)
            for row in rows:
                base = f"{row['kind']}/{row['layer']}"
                for field in SCALAR_FIELDS:
                    self._write_scalar(f"underflow/{base}/{field}", row[field], step)
                self._write_histogram(f"log2_abs_grad/{base}", row["hist_low"], step)
                self._write_histogram(f"log2_abs_grad_shadow/{base}", row["hist_shadow"], step)

    def write_step(self, step: int, loss_scale: float, skipped_steps: int) -> None:
        """The loss scale of a step and the skipped steps so far."""
        with self.writer.as_default():
            self._write_scalar("loss_scale", loss_scale, step)
            self._write_scalar("skipped_steps", skipped_steps, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
