"""Telemetry as TensorBoard event files, from the same records the CSVs hold.

Written with `tf.summary.write` and the scalar and histogram plugins' metadata,
so TensorBoard need not be installed to write them (`tf.summary.scalar` and
`histogram` are TensorBoard's code and refuse without it). Tags, per recorded
tensor (`kind` weight or activation, `layer` its variable path or layer name):

- `underflow/<kind>/<layer>/{flushed,lost,subnormal}_fraction`: scalars;
- `log2_abs_grad/<kind>/<layer>` and `log2_abs_grad_shadow/<kind>/<layer>`:
  histograms of floor(log2|S*g|) (one bucket per binade, empty ones included; the
  first and last buckets collect everything beyond `telemetry`'s range);
- `format/log2_smallest_subnormal`, `format/log2_smallest_normal`: the run
  format's ranges on the same axis, to read the histograms against;
- `loss_scale` and `skipped_steps` (cumulative) every step.
"""

from __future__ import annotations

import errno
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from convprobe.errors import OutputWriteFailed, reason
from convprobe.formats import Format
from convprobe.training.telemetry import decode_histogram, histogram_edges

__all__ = ["TensorBoardWriter", "SCALAR_FIELDS"]

#: The per-tensor fractions written as scalars.
SCALAR_FIELDS = ("flushed_fraction", "lost_fraction", "subnormal_fraction")

_HISTOGRAM_NOTE = ("floor(log2|S*g|) of the scaled gradient, one bucket per binade; read against "
                   "format/log2_smallest_subnormal and format/log2_smallest_normal")


#: The write failures whose operating-system message TensorFlow's errors carry in their text.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EACCES, errno.EROFS, errno.EPERM)


def os_reason(message: str) -> str:
    """The operating system's reason in a TensorFlow error message ('File too large (EFBIG)'),
    else its first line that is not an op's name."""
    for code in _WRITE_ERRNOS:
        if os.strerror(code) in message:
            return f"{os.strerror(code)} ({errno.errorcode[code]})"
    lines = [line.strip() for line in message.splitlines() if line.strip() and not line.strip().startswith("[")]
    return lines[0] if lines else "TensorFlow gave no reason"


class TensorBoardWriter:
    """One event-file writer in `directory` (created); `write_*` take the CSV records."""

    def __init__(self, directory: str | Path, fmt: Format):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self.tf = tf
        self.directory = Path(directory)
        with self._one_line():
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.writer = tf.summary.create_file_writer(str(directory))
        self.format = fmt

        def metadata(plugin: str, description: str = "") -> bytes:
            m = summary_pb2.SummaryMetadata(summary_description=description)
            m.plugin_data.plugin_name = plugin
            return m.SerializeToString()

        self._scalar = metadata("scalars")
        self._histogram = metadata("histograms", _HISTOGRAM_NOTE)
        self._compiled: dict[tuple[str, ...], Any] = {}  # one traced writer per set of tensors: one call per measured step
        self._step_writer = tf.function(self._write_step)  # (two eager writes cost about 1.5 ms)
        self._labels = {label: i for i, label in enumerate(histogram_edges())}

    def _dense(self, cell: str) -> np.ndarray:
        counts = np.zeros(len(self._labels), dtype=np.float64)
        for label, count in decode_histogram(cell).items():
            counts[self._labels[label]] = count
        return counts

    def _writer_for(self, bases: tuple[str, ...]):
        """A compiled function writing every tag of these tensors (eager summary writes cost
        about 0.1 ms each: a few hundred per measured step otherwise)."""
        tf = self.tf
        edges = np.array(histogram_edges(), dtype=np.float64)
        subnormal, normal = math.log2(self.format.smallest_subnormal), math.log2(self.format.tiny)

        def write(step, fractions, hist_low, hist_shadow):
            with self.writer.as_default():
                tf.summary.write("format/log2_smallest_subnormal", tf.constant(subnormal, tf.float32), step=step,
                                 metadata=self._scalar)
                tf.summary.write("format/log2_smallest_normal", tf.constant(normal, tf.float32), step=step,
                                 metadata=self._scalar)
                for i, base in enumerate(bases):
                    for j, field in enumerate(SCALAR_FIELDS):
                        tf.summary.write(f"underflow/{base}/{field}", fractions[i, j], step=step,
                                         metadata=self._scalar)
                    # Plugin layout: [k, 3] float64 rows of (left edge, right edge, count).
                    for name, hist in (("log2_abs_grad", hist_low), ("log2_abs_grad_shadow", hist_shadow)):
                        table = tf.stack([edges, edges + 1, hist[i]], axis=1)
                        tf.summary.write(f"{name}/{base}", table, step=step, metadata=self._histogram)

        return tf.function(write)

    @contextmanager
    def _one_line(self):
        """A failed event-file write (a full disk, a file-size limit) as the CLI's one line, with
        the operating system's reason (TensorFlow's message ends with the op that failed)."""
        try:
            yield
        except self.tf.errors.OpError as error:
            raise OutputWriteFailed(f"could not write TensorBoard events in {str(self.directory)!r}: "
                                    f"{os_reason(str(error.message))}") from None
        except OSError as error:
            raise OutputWriteFailed(f"could not write TensorBoard events in {str(self.directory)!r}: "
                                    f"{reason(error)}") from None

    def write_records(self, step: int, rows: list[dict]) -> None:
        """The scalars and histograms of one telemetry step's records."""
        with self._one_line():
            self._write_records(step, rows)

    def _write_records(self, step: int, rows: list[dict]) -> None:
        tf = self.tf
        bases = tuple(f"{row['kind']}/{row['layer']}" for row in rows)
        if bases not in self._compiled:
            self._compiled[bases] = self._writer_for(bases)
        fractions = np.array([[row[f] for f in SCALAR_FIELDS] for row in rows], dtype=np.float32)
        hist_low = np.stack([self._dense(row["hist_low"]) for row in rows])
        hist_shadow = np.stack([self._dense(row["hist_shadow"]) for row in rows])
        self._compiled[bases](tf.constant(step, tf.int64), tf.constant(fractions), tf.constant(hist_low),
                              tf.constant(hist_shadow))

    def write_step(self, step: int, loss_scale: float, skipped_steps: int) -> None:
        """The loss scale of a step and the skipped steps so far."""
        tf = self.tf
        with self._one_line():
            self._step_writer(tf.constant(step, tf.int64), tf.constant(loss_scale, tf.float32),
                              tf.constant(skipped_steps, tf.float32))

    def _write_step(self, step, loss_scale, skipped_steps):
        """`write_step`'s two scalars, traced once (`_step_writer`)."""
        with self.writer.as_default():
            self.tf.summary.write("loss_scale", loss_scale, step=step, metadata=self._scalar)
            self.tf.summary.write("skipped_steps", skipped_steps, step=step, metadata=self._scalar)

    def flush(self) -> None:
        with self._one_line():
            self.writer.flush()

    def close(self) -> None:
        with self._one_line():
            self.writer.close()
