"""The batch-innermost layout of a filter gradient's crafted rows."""

import numpy as np
import pytest

from convprobe.backends.emulated import EmulatedBackend
from convprobe.identify.batch_order import BatchInnermost, batch_innermost_layout


def test_a_kernel_summing_batch_innermost_meets_the_terms_in_order():
    """Terms 0..K-1 in (n, oh, ow) order: a batch-innermost sequential fp16 sum of the laid-out
    dy equals an image-by-image sum of the plain one, bit for bit (2048 + 1 + -2048 shows the order)."""
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((3, 2, 5, 4)).astype(np.float16)
    dy[0, 0, 0, 0], dy[0, 0, 1, 0], dy[0, 0, 2, 0] = 2048.0, 1.0, -2048.0
    x = np.full((3, 4, 7, 2), 1.0, np.float16)
    image_by_image = EmulatedBackend("sequential:fp16").conv2d_backprop_filter(x, dy, (3, 3, 2, 4))
    laid_out = BatchInnermost(EmulatedBackend("sequential:fp16:positions=hwn"))
    np.testing.assert_array_equal(laid_out.conv2d_backprop_filter(x, dy, (3, 3, 2, 4)).view(np.uint16),
                                  image_by_image.view(np.uint16))
    assert image_by_image[0, 0, 0, 0] != EmulatedBackend("sequential:fp16:positions=hwn").conv2d_backprop_filter(
        x, dy, (3, 3, 2, 4))[0, 0, 0, 0]
    back = batch_innermost_layout(dy).reshape(3, 10, 4).transpose(1, 0, 2).reshape(-1, 4)
    np.testing.assert_array_equal(back, dy.reshape(-1, 4))  # read (oh, ow, n), it is the plain order


def test_only_a_constant_x_can_be_laid_out():
    backend = BatchInnermost(EmulatedBackend("sequential:fp16"))
    x = np.ones((2, 3, 3, 1), np.float16)
    x[1, 2, 2, 0] = 2.0
    with pytest.raises(ValueError, match="x must be one constant"):
        backend.conv2d_backprop_filter(x, np.ones((2, 1, 1, 1), np.float16), (3, 3, 1, 1))
    np.testing.assert_array_equal(backend.conv2d(x, np.ones((3, 3, 1, 1), np.float16)),
                                  EmulatedBackend("sequential:fp16").conv2d(x, np.ones((3, 3, 1, 1), np.float16)))
