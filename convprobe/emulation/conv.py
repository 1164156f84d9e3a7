"""2-D convolution (and its two gradients) as im2col + a modelled reduction.

Layouts follow TensorFlow: x and dy are NHWC, filters HWIO with I = C_in / groups;
padding is "VALID", "SAME" (TensorFlow's split: the extra row/column goes to
the bottom/right) or explicit ``[(top, bottom), (left, right)]``.

Reduction orders (what the K sum of each output runs over, in order):

* forward: the KH*KW*C_in/groups taps, nested as `model.order` (default "hwc":
  kernel row outermost, input channel innermost). Taps that fall in the padding
  contribute +0 * w products, as im2col does.
* gradient w.r.t. input: the forward convolution, stride 1, of dy dilated by
  `strides` (zeros inserted) and padded by (dilation*(KH-1) - top, ...), with the
  filter rotated 180 degrees and its in/out channels swapped (dilated by
  `dilation`): K = KH*KW*C_out/groups taps in `model.order`, zeros included, as
  Eigen's SpatialConvolutionBackwardInput forms it.
* gradient w.r.t. filter: the N*OH*OW output positions in (n, oh, ow) order, or with
  `model.positions` "hwn" in (oh, ow, n) order.

Stochastic rounding is keyed by the flat C-order index of each result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from convprobe.emulation._threads import over_tasks
from convprobe.emulation.models import AccumulationModel, kernel_config
from convprobe.emulation.inputs import as_carrier, finish, fp16_or_narrower, numeric_array
from convprobe.errors import InvalidArgument, invalid_choice, is_integer
from convprobe.options import Positions

__all__ = [
    "conv2d",
    "conv2d_backprop_input",
    "conv2d_backprop_filter",
    "conv_output_shape",
    "resolve_padding",
    "pair",
]

Padding = str | Sequence[Sequence[int]]


def pair(value: int | Sequence[int], argument: str) -> tuple[int, int]:
    """(h, w) from an int or a pair of ints, each >= 1."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        items: tuple[Any, ...] = (int(value), int(value))  # (a user's values: checked below)
    else:
        try:
            items = tuple(value)  # type: ignore[arg-type]  # (a bool: TypeError, refused below)
        except TypeError:
            items = ()
        if len(items) == 4:  # TensorFlow's NHWC form [1, h, w, 1]
            items = items[1:3]
    if len(items) != 2 or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in items
    ):
        raise InvalidArgument(f"{argument} must be a positive integer or a pair of positive "
                              f"integers; received {value!r}")
    return int(items[0]), int(items[1])


def resolve_padding(padding: Padding, in_hw: tuple[int, int], k_hw: tuple[int, int],
                    strides: tuple[int, int], dilation: tuple[int, int]
                    ) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) for a padding spec, TensorFlow's rules for SAME."""
    if isinstance(padding, str):
        mode = padding.strip().upper()
        if mode == "VALID":
            return (0, 0), (0, 0)
        if mode == "SAME":
            pads = []
            for n, k, s, d in zip(in_hw, k_hw, strides, dilation):
                out = -(-n // s)
                total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
                pads.append((total // 2, total - total // 2))
            return pads[0], pads[1]
        raise invalid_choice("padding", padding, ("VALID", "SAME", "[(top, bottom), (left, right)]"))
    try:
        rows = [tuple(r) for r in padding]
    except TypeError:
        rows = []
    if len(rows) == 4 and rows[0] == (0, 0) and rows[3] == (0, 0):
        rows = rows[1:3]
    ok = len(rows) == 2 and all(
        len(r) == 2 and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0
                            for v in r) for r in rows
    )
    if not ok:
        raise invalid_choice("padding", padding, ("VALID", "SAME", "[(top, bottom), (left, right)]"))
    return (int(rows[0][0]), int(rows[0][1])), (int(rows[1][0]), int(rows[1][1]))


def conv_output_shape(in_hw: tuple[int, int], k_hw: tuple[int, int], strides: tuple[int, int],
                      dilation: tuple[int, int], pads) -> tuple[int, int]:
    """(OH, OW) of a convolution."""
    return tuple(
        (n + p0 + p1 - (k - 1) * d - 1) // s + 1
        for n, k, s, d, (p0, p1) in zip(in_hw, k_hw, strides, dilation, pads)
    )


# Index arithmetic below is unsigned (np.uint64): every index is non-negative, and numba
# emits a negative-index wraparound check for signed ones, which stops LLVM from
# vectorising the copies (measured 2.4x slower).
U = np.uint64


@njit(cache=True, nogil=True)
def _im2col_rows(t0, t1, x, out, c0, cg, kh, kw, sh, sw, dh, dw, top, left, oh, ow, st_h, st_w, st_c):
    """Rows (b, y) t0 .. t1 - 1 of out[(b, y, x), tap], the (M, K) layout; x is NHWC, out flat."""
    n, h, w, c_all = x.shape
    xf = x.ravel()
    k = kh * kw * cg
    for r in range(t0, t1):
        b, y = r // oh, r % oh
        for xo in range(ow):
            row = (r * ow + xo) * k
            for i in range(kh):
                ih = y * sh + i * dh - top
                for j in range(kw):
                    iw = xo * sw + j * dw - left
                    base = U(row + i * st_h + j * st_w)
                    if 0 <= ih < h and 0 <= iw < w:
                        src = U(((b * h + ih) * w + iw) * c_all + c0)
                        if st_c == 1:  # the default "hwc" order: a contiguous run
                            for c in range(U(cg)):
                                out[base + c] = xf[src + c]
                        else:
                            for c in range(U(cg)):
                                out[base + c * U(st_c)] = xf[src + c]
                    else:
                        for c in range(U(cg)):
                            out[base + c * U(st_c)] = 0


@njit(cache=True, nogil=True)
def _im2col_cols(t0, t1, x, out, c0, cg, kh, kw, sh, sw, dh, dw, top, left, oh, ow):
    """Taps t0 .. t1 - 1 of out[tap, (b, y, x)], the (K, M) layout, taps nested (h, w, c); out flat.
    One output row per task, written contiguously."""
    n, h, w, c_all = x.shape
    xf = x.ravel()
    m = U(n * oh * ow)
    for t in range(t0, t1):
        i, j, c = t // (kw * cg), (t // cg) % kw, t % cg
        row = U(t) * m
        for b in range(n):
            for y in range(oh):
                ih = y * sh + i * dh - top
                dst = row + U((b * oh + y) * ow)
                if 0 <= ih < h:
                    src = U((b * h + ih) * w * c_all + c0 + c)
                    for xo in range(ow):
                        iw = xo * sw + j * dw - left
                        inside = 0 <= iw < w
                        out[dst + U(xo)] = xf[src + U(iw * c_all if inside else 0)] if inside else 0
                else:
                    for xo in range(U(ow)):
                        out[dst + xo] = 0


def _im2col(x: np.ndarray, k_hw, strides, dilation, pads, out_hw, channels: tuple[int, int],
            order: str = "hwc", transposed: bool = False) -> np.ndarray:
    """Patches of NHWC x for channels [c0, c1): (M, K) with M = N*OH*OW and the K axis
    nested as `order`, or (K, M) nested "hwc" if `transposed`; C-contiguous, x's dtype.

    Taps in the padding read as +0; negative pads crop."""
    (top, _), (left, _) = pads
    c0, c1 = channels
    cg = c1 - c0
    m, k = x.shape[0] * out_hw[0] * out_hw[1], k_hw[0] * k_hw[1] * cg
    x = np.ascontiguousarray(x)
    out = np.empty((k, m) if transposed else (m, k), dtype=x.dtype)
    bits = (lambda a: a.view(np.uint16)) if x.dtype == np.float16 else (lambda a: a)
    geometry = (c0, cg, *k_hw, *strides, *dilation, top, left, *out_hw)
    if transposed:
        over_tasks(_im2col_cols, k, bits(x), bits(out).reshape(-1), *geometry)
    else:
        sizes = {"h": k_hw[0], "w": k_hw[1], "c": cg}
        st = {order[2]: 1, order[1]: sizes[order[2]], order[0]: sizes[order[2]] * sizes[order[1]]}
        over_tasks(_im2col_rows, x.shape[0] * out_hw[0], bits(x), bits(out).reshape(-1), *geometry,
                   st["h"], st["w"], st["c"])
    return out


def _check4(arr: np.ndarray, argument: str, layout: str) -> None:
    """4-D, with every axis but the batch (N of NHWC) of size at least 1."""
    if arr.ndim != 4:
        raise InvalidArgument(f"{argument} must be a 4-D {layout} array; received shape "
                              f"{arr.shape}")
    sized = arr.shape[1:] if layout == "NHWC" else arr.shape
    if min(sized) < 1:
        names = ", ".join(layout[1:] if layout == "NHWC" else layout)
        raise InvalidArgument(f"{argument} ({layout}) must have {names} of at least 1; received "
                              f"shape {arr.shape}")


def _groups(groups: int) -> int:
    if not is_integer(groups) or groups < 1:
        raise InvalidArgument(f"groups must be a positive integer; received {groups!r}")
    return int(groups)


def _conv_core(x: np.ndarray, w: np.ndarray, model: AccumulationModel, strides, pads,
               dilation, groups: int, fp16_inputs: bool = False) -> np.ndarray:
    """Forward convolution on arrays from `_prepare`; returns NHWC results (exact) in
    their carrier dtype."""
    n, h, wd, c = x.shape
    kh, kw, cg, cout = w.shape
    og = cout // groups
    out_hw = conv_output_shape((h, wd), (kh, kw), strides, dilation, pads)
    if min(out_hw) < 1:
        raise InvalidArgument(f"x spatial size {(h, wd)} is too small for a {kh}x{kw} filter "
                              f"with dilation {dilation} and padding {pads}")
    axes = tuple("hwc".index(ch) for ch in model.order)
    m = n * out_hw[0] * out_hw[1]
    out = np.empty((m, cout), dtype=x.dtype)
    for g in range(groups):
        a = _im2col(x, (kh, kw), strides, dilation, pads, out_hw, (g * cg, (g + 1) * cg),
                    model.order)
        wg = w[:, :, :, g * og:(g + 1) * og].transpose(*axes, 3).reshape(-1, og)
        model.gemm_into(a, wg, out, g * og, fp16_inputs)
    return out.reshape(n, out_hw[0], out_hw[1], cout)


def _prepare(x, w, model, x_name, w_name, x_layout, w_layout):
    """(x, w) validated and in the carrier dtype the kernels take (`model.carrier`:
    float16 or float32 where a kernel reads fp16 inputs in that form, float64 otherwise),
    and whether both hold only fp16-representable values."""
    kernel_config(model)  # (refuses what is not a model)
    x, w = numeric_array(x, x_name), numeric_array(w, w_name)
    _check4(x, x_name, x_layout)  # (shapes before values)
    _check4(w, w_name, w_layout)
    narrow = fp16_or_narrower(x, w)
    carrier = model.carrier(narrow)
    return as_carrier(x, x_name, model, narrow, carrier), as_carrier(w, w_name, model, narrow, carrier), narrow


def conv2d(x: np.ndarray, w: np.ndarray, model: AccumulationModel, *,
           strides: int | Sequence[int] = 1, padding: Padding = "VALID",
           dilation: int | Sequence[int] = 1, groups: int = 1) -> np.ndarray:
    """Convolution (cross-correlation, as in TensorFlow) of NHWC x with HWIO w under `model`."""
    xc, wc, narrow = _prepare(x, w, model, "x", "w", "NHWC", "HWIO")
    strides, dilation, groups = pair(strides, "strides"), pair(dilation, "dilation"), _groups(groups)
    c, (kh, kw, cg, cout) = xc.shape[3], wc.shape
    if c != cg * groups:
        raise InvalidArgument(f"w input channels ({cg}) times groups ({groups}) must equal x "
                              f"channels ({c})")
    if cout % groups:
        raise InvalidArgument(f"w output channels ({cout}) must be divisible by groups ({groups})")
    pads = resolve_padding(padding, xc.shape[1:3], (kh, kw), strides, dilation)
    return finish(_conv_core(xc, wc, model, strides, pads, dilation, groups, narrow), model)


def gemm(a: np.ndarray, b: np.ndarray, model: AccumulationModel) -> np.ndarray:
    """out[i, j] = the model's sum of a[i, k] * b[j, k], k in index order (a (A, K), b (B, K)):
    the GEMM of a 1x1 convolution of a's rows by b's rows as filters, on the convolutions'
    kernels (`dot` takes it for a matrix product). Stochastic rounding is keyed by i * B + j,
    the flat index, as in `dot`."""
    x, w, narrow = _prepare(np.asarray(a)[None, None], np.asarray(b).T[None, None], model, "a", "b", "NHWC", "HWIO")
    return finish(_conv_core(x, w, model, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, narrow)[0, 0], model)


def _shape4(shape, argument: str) -> tuple[int, int, int, int]:
    try:
        out = tuple(int(v) for v in shape)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 4 or min(out) < 1:
        raise InvalidArgument(f"{argument} must be 4 positive integers; received {shape!r}")
    return out


def conv2d_backprop_input(dy: np.ndarray, w: np.ndarray, input_shape: Sequence[int],
                          model: AccumulationModel, *, strides: int | Sequence[int] = 1,
                          padding: Padding = "VALID", dilation: int | Sequence[int] = 1,
                          groups: int = 1) -> np.ndarray:
    """Gradient of conv2d w.r.t. its input: dx (NHWC, `input_shape`) from dy and w."""
    dyc, wc, narrow = _prepare(dy, w, model, "dy", "w", "NHWC", "HWIO")
    strides, dilation, groups = pair(strides, "strides"), pair(dilation, "dilation"), _groups(groups)
    n, h, wd, c = _shape4(input_shape, "input_shape")
    kh, kw, cg, cout = wc.shape
    if c != cg * groups or cout % groups:
        raise InvalidArgument(f"w shape {wc.shape} does not match input channels {c} with "
                              f"groups {groups}")
    pads = resolve_padding(padding, (h, wd), (kh, kw), strides, dilation)
    out_hw = conv_output_shape((h, wd), (kh, kw), strides, dilation, pads)
    if dyc.shape != (n, *out_hw, cout):
        raise InvalidArgument(f"dy shape must be {(n, *out_hw, cout)} for input_shape "
                              f"{(n, h, wd, c)} and w {wc.shape}; received {dyc.shape}")
    (sh, sw), (dh, dw) = strides, dilation
    dil = np.zeros((n, (out_hw[0] - 1) * sh + 1, (out_hw[1] - 1) * sw + 1, cout), dyc.dtype)
    dil[:, ::sh, ::sw, :] = dyc
    back = []
    for size, k, d, (p0, _), dlen in zip((h, wd), (kh, kw), (dh, dw), pads, dil.shape[1:3]):
        lo = (k - 1) * d - p0
        back.append((lo, size + (k - 1) * d - lo - dlen))
    og = cout // groups
    wt = (wc[::-1, ::-1].reshape(kh, kw, cg, groups, og).transpose(0, 1, 4, 3, 2)
          .reshape(kh, kw, og, groups * cg))
    wt = np.ascontiguousarray(wt)
    return finish(_conv_core(dil, wt, model, (1, 1), tuple(back), dilation, groups, narrow),
                  model)


def conv2d_backprop_filter(x: np.ndarray, dy: np.ndarray, filter_shape: Sequence[int],
                           model: AccumulationModel, *, strides: int | Sequence[int] = 1,
                           padding: Padding = "VALID", dilation: int | Sequence[int] = 1,
                           groups: int = 1) -> np.ndarray:
    """Gradient of conv2d w.r.t. its filter: dw (HWIO, `filter_shape`) from x and dy."""
    xc, dyc, narrow = _prepare(x, dy, model, "x", "dy", "NHWC", "NHWC")
    strides, dilation, groups = pair(strides, "strides"), pair(dilation, "dilation"), _groups(groups)
    kh, kw, cg, cout = _shape4(filter_shape, "filter_shape")
    n, h, wd, c = xc.shape
    if c != cg * groups or cout % groups:
        raise InvalidArgument(f"filter_shape {(kh, kw, cg, cout)} does not match x channels "
                              f"{c} with groups {groups}")
    pads = resolve_padding(padding, (h, wd), (kh, kw), strides, dilation)
    out_hw = conv_output_shape((h, wd), (kh, kw), strides, dilation, pads)
    if min(out_hw) < 1 or dyc.shape != (n, *out_hw, cout):
        raise InvalidArgument(f"dy shape must be {(n, *out_hw, cout)} for x {xc.shape} and "
                              f"filter_shape {(kh, kw, cg, cout)}; received {dyc.shape}")
    m = n * out_hw[0] * out_hw[1]
    og = cout // groups
    out = np.empty((kh * kw * cg, cout), dtype=xc.dtype)
    # the positions in the model's order: (n, oh, ow), or with the batch innermost
    order = (slice(None) if model.positions == Positions.NHW
             else np.arange(m).reshape(n, *out_hw).transpose(1, 2, 0).ravel())
    for g in range(groups):
        a = _im2col(xc, (kh, kw), strides, dilation, pads, out_hw, (g * cg, (g + 1) * cg),
                    transposed=True)
        dyg = dyc[..., g * og:(g + 1) * og].reshape(m, og)
        model.gemm_into(np.ascontiguousarray(a[:, order]), np.ascontiguousarray(dyg[order]), out, g * og, narrow)
    return finish(out.reshape(kh, kw, cg, cout), model)
