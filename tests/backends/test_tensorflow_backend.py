"""TensorFlowBackend's ops agree exactly with the emulator's exact model on integer data.

Small integers make every product and sum exact in fp32, so any difference is a
convention bug (padding, strides, dilation, gradient shapes), not rounding.
"""

import numpy as np
import pytest

from convprobe.backends import TensorFlowBackend

from conftest import assert_conv_ops_match_exact


@pytest.mark.tensorflow
@pytest.mark.parametrize("padding", ["VALID", "SAME", [(1, 1), (0, 2)]])
@pytest.mark.parametrize("strides,dilation", [(1, 1), (2, 1), (1, 2)])
def test_conv2d_and_both_gradients_match_exact_emulation(padding, strides, dilation):
    if padding == "SAME" and strides > 1 and dilation > 1:
        pytest.skip("TensorFlow rejects strides > 1 together with dilation > 1")
    assert_conv_ops_match_exact(  # CPU kernels without dilation (explicit padding) refuse in their words
        TensorFlowBackend("cpu"), padding, strides, dilation,
        refused=lambda exc: dilation > 1 and str(exc).startswith("TensorFlow: Current CPU implementations do not "
                                                                 "yet support dilation rates larger than 1"))


@pytest.mark.tensorflow
def test_other_tensorflow_errors_are_not_taken_for_a_refusal():
    """A bad shape is TensorFlow's error, not an unsupported configuration."""
    import tensorflow as tf

    with pytest.raises(tf.errors.InvalidArgumentError):
        TensorFlowBackend("cpu").conv2d(np.ones((1, 4, 4, 3), np.float32), np.ones((3, 3, 2, 1), np.float32))


@pytest.mark.tensorflow
def test_an_error_without_a_message_is_not_taken_for_a_refusal():
    """An empty TensorFlow message is left as TensorFlow's error (no IndexError on its first line)."""
    import tensorflow as tf

    from convprobe.backends.tensorflow import _unsupported

    empty = tf.errors.UnimplementedError(None, None, "")
    assert _unsupported(empty) is empty
    refusal = tf.errors.UnimplementedError(None, None, "{{node Conv2D}} Kernels do not yet support this\nmore")
    assert str(_unsupported(refusal)) == "TensorFlow: Kernels do not yet support this"


@pytest.mark.tensorflow
def test_calls_run_together_under_xla_give_each_calls_own_bits_from_few_compilations():
    """37 forward and input-gradient calls on signed fp16 operands, run together in padded groups
    of TOGETHER, equal each call compiled alone; a second batch of another length reuses the
    groups' traced functions."""
    from convprobe.backends.tensorflow import TOGETHER

    rng = np.random.default_rng(5)
    backend = TensorFlowBackend("cpu", jit_compile=True)
    w = (rng.standard_normal((3, 3, 16, 4)) * 4).astype(np.float16)
    calls = []
    for i in range(37):
        if i % 3:
            calls.append(("conv2d", ((rng.standard_normal((1, 6, 6, 16)) * 8).astype(np.float16), w),
                          {"padding": "SAME"}))
        else:
            calls.append(("conv2d_backprop_input", ((rng.standard_normal((1, 6, 6, 4)) * 8).astype(np.float16), w,
                                                    (1, 6, 6, 16)), {"padding": "SAME"}))
    together = backend.run_together(calls)
    alone = [np.asarray(getattr(backend, name)(*args, **kwargs)) for name, args, kwargs in calls]
    assert len(together) == len(calls)
    for i, (got, want) in enumerate(zip(together, alone)):
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (i, calls[i][0])
    traced = len(backend._together)
    assert traced <= -(-len(calls) // TOGETHER), traced
    backend.run_together(calls[:TOGETHER])  # the first group again, on the same plan
    assert len(backend._together) == traced
