"""The emulator computes in the default floating-point environment wherever it is called from:
TensorFlow runs a numpy_function in threads that flush subnormals and read them as zero, and
a thread starts in its creator's environment."""

from __future__ import annotations

import numpy as np
import pytest

from convprobe.emulation import default_float_environment
from convprobe.emulation._threads import _executor

pytestmark = pytest.mark.tensorflow


def _half_of_the_smallest_normal() -> float:
    """2**-127 as float32: a subnormal, 0 where results are flushed to zero."""
    return float((np.full(2, 2.0**-126, np.float32) * np.float32(0.5))[0])


def test_inside_tensorflow_the_emulator_keeps_subnormals_and_gives_the_thread_its_own_back():
    import tensorflow as tf

    def inside(_):
        before = _half_of_the_smallest_normal()
        with default_float_environment():
            within = _half_of_the_smallest_normal()
            pooled = _executor().submit(_half_of_the_smallest_normal).result()
        after = _half_of_the_smallest_normal()
        return np.array([before, within, pooled, after])

    before, within, pooled, after = tf.function(
        lambda t: tf.numpy_function(inside, [t], tf.float64), autograph=False)(tf.constant(0.0, tf.float64)).numpy()
    assert within == pooled == 2.0**-127, (within, pooled)
    assert after == before  # TensorFlow's thread as it was (it flushes on x86: before == 0)
