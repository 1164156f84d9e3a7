"""Winograd and FFT convolutions, written from their definitions (Lavin and Gray, CVPR
2016, for Winograd's F(m x m, 3 x 3) matrices; NumPy's pocketfft for the FFT): what
cuDNN's WINOGRAD and FFT algorithms do on a GPU: backends whose outputs are not a direct
sum of products, which the direct-sum probe must tell apart (`scripts/direct_sum_transforms.py`,
tests/identify/test_direct_sum.py, which also checks that they compute the convolution)."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np

from convprobe.backends.base import AbstractBackend

_Matrix = list[list[F | int]]

#: (B^T, G, A^T) of F(m, 3) for m = 2 and 4 (Lavin and Gray 2016, section 4.1 and 4.2).
WINOGRAD: dict[int, tuple[_Matrix, _Matrix, _Matrix]] = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [F(1, 2), F(1, 2), F(1, 2)], [F(1, 2), F(-1, 2), F(1, 2)], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[F(1, 4), 0, 0], [F(-1, 6), F(-1, 6), F(-1, 6)], [F(-1, 6), F(1, 6), F(-1, 6)],
         [F(1, 24), F(1, 12), F(1, 6)], [F(1, 24), F(-1, 12), F(1, 6)], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


class _TransformConv(AbstractBackend):
    """The input gradient of a stride-1 VALID conv is the forward conv of dy, padded by the
    kernel less one, with the filter rotated and its channels swapped: the transform
    runs on the gradient as on the forward conv."""

    def conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        assert padding == "VALID" and strides in (1, (1, 1)) and dilation in (1, (1, 1))
        kh, kw = w.shape[:2]
        padded = np.pad(dy, ((0, 0), (kh - 1, kh - 1), (kw - 1, kw - 1), (0, 0)))
        return self.conv2d(padded, np.ascontiguousarray(w[::-1, ::-1].transpose(0, 1, 3, 2)))


class WinogradBackend(_TransformConv):
    """F(m x m, 3 x 3), stride 1, VALID: transforms computed exactly and rounded to
    `storage` (fp16 as an fp16 kernel does, fp32 as cuDNN's fp16 Winograd does, or fp64
    to check the algebra), the per-element GEMM over channels in fp32."""

    name = "winograd"

    def __init__(self, m: int, storage=np.float16):
        self.m, self.storage = m, storage
        self.bt, self.g, self.at = (np.array([[float(v) for v in row] for row in mat]) for mat in WINOGRAD[m])

    def _round(self, a):
        return a.astype(self.storage).astype(np.float64 if self.storage == np.float64 else np.float32)

    @staticmethod
    def _transform(mat, a, axis):
        """mat applied along two axes, as a kernel's adds do: zero coefficients skipped (a
        product 0 * inf would make an overflowed, unused term NaN)."""
        for ax in (axis, axis + 1):
            a = np.stack([sum(c * np.take(a, i, ax) for i, c in enumerate(row) if c) for row in mat], ax)
        return a

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        assert padding == "VALID" and strides in (1, (1, 1)) and dilation in (1, (1, 1)) and w.shape[:2] == (3, 3)
        m, t = self.m, self.m + 2
        n, h, wd, c = x.shape
        oh, ow = h - 2, wd - 2
        assert oh % m == 0 and ow % m == 0, "the output must tile exactly"
        v = self._round(self._transform(self.g, w.astype(np.float64), 0))
        tiles = np.stack([np.stack([x[:, i:i + t, j:j + t, :] for j in range(0, ow, m)], 1)
                          for i in range(0, oh, m)], 1).astype(np.float64)  # (n, ti, tj, t, t, c)
        u = self._round(self._transform(self.bt, tiles, 3))
        with np.errstate(over="ignore", invalid="ignore"):
            mm = self._round(np.einsum("nxyabc,abco->nxyabo", u, v))
            y = self._transform(self.at, mm.astype(np.float64), 3)
        return y.transpose(0, 1, 3, 2, 4, 5).reshape(n, oh, ow, -1).astype(self.storage)


class FFTBackend(_TransformConv):
    """Correlation through 2-D FFTs over the image, stride 1, VALID, in `dtype`: each
    transform and product is rounded to it (NumPy 2 computes a float32 FFT in single
    precision; NumPy 1 in double, which the rounding after each step still makes an
    fp32 pipeline)."""

    name = "fft"

    def __init__(self, dtype=np.float32):
        self.dtype = dtype
        self.complex = np.result_type(dtype, np.complex64)

    def _rfft2(self, a, axes):
        return np.fft.rfft2(a.astype(self.dtype), axes=axes).astype(self.complex)

    def _irfft2(self, a, s, axes):
        return np.fft.irfft2(a.astype(self.complex), s=s, axes=axes).astype(self.dtype)

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        assert padding == "VALID" and strides in (1, (1, 1)) and dilation in (1, (1, 1))
        n, h, wd, c = x.shape
        kh, kw = w.shape[:2]
        xf = self._rfft2(x, (1, 2))
        flipped = np.zeros((h, wd, *w.shape[2:]), self.dtype)
        flipped[:kh, :kw] = w[::-1, ::-1].astype(self.dtype)
        wf = self._rfft2(flipped, (0, 1))
        y = self._irfft2(np.einsum("nijc,ijco->nijo", xf, wf), (h, wd), (1, 2))
        return y[:, kh - 1:, kw - 1:, :]

    def conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        """dw[i, j] = sum over n, p, q of x[n, p + i, q + j] dy[n, p, q]: the correlation of x
        with dy, from the product of x's transform and the conjugate of dy's (no wrap: p + i < H)."""
        assert padding == "VALID" and strides in (1, (1, 1)) and dilation in (1, (1, 1))
        n, h, wd, c = x.shape
        kh, kw = filter_shape[:2]
        xf = self._rfft2(x, (1, 2))
        padded = np.zeros((n, h, wd, dy.shape[3]), self.dtype)
        padded[:, :dy.shape[1], :dy.shape[2]] = dy.astype(self.dtype)
        df = self._rfft2(padded, (1, 2))
        dw = self._irfft2(np.einsum("nijc,nijo->ijco", xf, np.conj(df)), (h, wd), (0, 1))
        return dw[:kh, :kw]
