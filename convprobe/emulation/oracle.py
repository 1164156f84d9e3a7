"""Slow scalar reference in exact rationals: the truth the compiled engine is tested against.

Every modelled step is computed exactly with `fractions.Fraction` and rounded
once, by a rounding written from the definitions in
`convprobe.emulation.rounding` (no bit tricks, no round-to-odd). Zeros, infs and
NaNs follow IEEE 754 (an exact zero sum is +0 unless both operands are -0).
Convolutions index inputs straight from the definitions in
`convprobe.emulation.conv` (no im2col). Same signatures as the engine; meant for
small shapes only.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from convprobe.emulation.composites import Columns, Lanes, Reverse, Rows, SplitK
from convprobe.emulation.conv import conv_output_shape, pair, resolve_padding
from convprobe.emulation.models import (
    AccumulationModel,
    Blocked,
    Chunked,
    Exact,
    Pairwise,
    Sequential,
    as_format,
)
from convprobe.emulation.rounding import check_rbits, resolve_format
from convprobe.errors import InvalidArgument
from convprobe.formats import Format
from convprobe.options import Alignment, CAddition, KLayout, Zeros
from convprobe.random_stream import LOWBIAS32, WEYL32

__all__ = [
    "round_value",
    "round_to_format",
    "random_bits",
    "reduce",
    "dot",
    "conv2d",
    "conv2d_backprop_input",
    "conv2d_backprop_filter",
]

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
Value = float | Fraction  # float: zero, inf or NaN; Fraction: nonzero finite


def _splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * LOWBIAS32[0]) & _M32
    x ^= x >> 15
    x = (x * LOWBIAS32[1]) & _M32
    return x ^ (x >> 16)


def random_bits(seed: int, index: int, event: int, rbits: int) -> int:
    """The random integer of stochastic rounding event `event` of output `index`
    (`convprobe.random_stream`, version 2)."""
    key = _splitmix(seed ^ _splitmix(index)) >> 32
    return _lowbias32((key + event * WEYL32) & _M32) >> (32 - rbits)


def _floor_log2(x: Fraction) -> int:
    """floor(log2(x)) for a positive rational."""
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    return e


def round_value(v: Value, fmt: Format, mode: str = "nearest_even", *, subnormals: str = "keep",
                overflow: str = "inf", r: int = 0, rbits: int = 32) -> float:
    """Round one exact value to `fmt`, straight from the definitions."""
    if isinstance(v, float):
        if math.isnan(v):
            return v
        if math.isinf(v):
            return v if fmt.has_inf else math.nan
        if v == 0.0:
            return v
        v = Fraction(v)
    if v == 0:
        return 0.0
    neg = v < 0
    a = -v if neg else v
    e = _floor_log2(a)
    keep = fmt.subnormals and subnormals == "keep"
    q = (max(e, fmt.emin) if keep else e) - fmt.precision + 1
    y = a / Fraction(2) ** q
    kept = math.floor(y)
    frac = y - kept
    if mode == "nearest_even":
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and kept % 2 == 1)
    elif mode == "toward_zero":
        up = False
    else:
        up = math.floor(frac * 2**rbits) + r >= 2**rbits
    mag = (kept + int(up)) * Fraction(2) ** q
    if mag == 0 or (not keep and mag < Fraction(2) ** fmt.emin):
        return -0.0 if neg else 0.0
    if mag > Fraction(fmt.max):
        if overflow == "saturate":
            mag = Fraction(fmt.max)
        elif fmt.has_inf:
            return -math.inf if neg else math.inf
        else:
            return math.nan
    out = float(mag)
    return -out if neg else out


def round_to_format(values, fmt, rounding="nearest_even", *, subnormals="keep", overflow="inf",
                    rng=None, rbits=None) -> np.ndarray:
    """Scalar-loop `round_to_format` (same random draws as the engine)."""
    fmt = resolve_format(fmt, "fmt")
    x = np.asarray(values, dtype=np.float64)
    flat = x.reshape(-1)
    rs = np.zeros(flat.shape, dtype=np.int64)
    rbits = check_rbits(rbits, fmt, rounding)
    if rounding != "stochastic":
        rbits = 1
    else:
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        rs = gen.integers(0, 1 << rbits, size=flat.shape, dtype=np.int64)
    out = [round_value(float(v), fmt, rounding, subnormals=subnormals, overflow=overflow,
                       r=int(r), rbits=rbits) for v, r in zip(flat, rs)]
    return np.array(out, dtype=np.float64).reshape(x.shape)


def multiply_exact(a: float, b: float) -> Value:
    if not (math.isfinite(a) and math.isfinite(b)) or a == 0.0 or b == 0.0:
        return a * b
    return Fraction(a) * Fraction(b)


def _norm(v: Value) -> Value:
    if isinstance(v, float) and math.isfinite(v) and v != 0.0:
        return Fraction(v)
    return v


def add_exact(x: Value, y: Value) -> Value:
    x, y = _norm(x), _norm(y)
    fx, fy = isinstance(x, float), isinstance(y, float)
    if (fx and not math.isfinite(x)) or (fy and not math.isfinite(y)):
        xs = x if fx else (1.0 if x > 0 else -1.0)
        ys = y if fy else (1.0 if y > 0 else -1.0)
        return xs + ys
    if fx and fy:  # both zero
        return -0.0 if (math.copysign(1.0, x) < 0 and math.copysign(1.0, y) < 0) else 0.0
    if fx:
        return y
    if fy:
        return x
    s = x + y
    return s if s != 0 else 0.0


class _Stepper:
    """Applies one model's roundings, numbering stochastic events per output."""

    def __init__(self, model: AccumulationModel, index: int):
        self.m = model
        self.index = index
        self.ev = 0
        self.rbits = model.random_bits

    def rnd(self, v: Value, fmt: Format, mode: str | None = None) -> float:
        m = self.m
        mode = mode or m.rounding
        r = 0
        if mode == "stochastic":
            r = random_bits(m.seed, self.index, self.ev, self.rbits)
            self.ev += 1
        return round_value(v, fmt, mode, subnormals=m.subnormals, overflow=m.overflow, r=r,
                           rbits=self.rbits)

    def product(self, a: float, b: float) -> Value:
        p = multiply_exact(a, b)
        if isinstance(self.m.product, Format):  # (else "exact")
            return self.rnd(p, self.m.product, "nearest_even")
        return p

    def accumulate(self, s: Value, t: Value, fmt: Format | None = None) -> float:
        exact = add_exact(s, t)
        if isinstance(self.m.addition, Format) and fmt is None:  # (else "exact")
            exact = self.rnd(exact, self.m.addition, "nearest_even")
        return self.rnd(exact, fmt or as_format(self.m.accumulator))


def _exponent(v: Value, emin: int) -> int | None:
    """floor(log2|v|) clamped below at emin; None for zero."""
    return None if v == 0 else max(_floor_log2(abs(Fraction(v))), emin)


def _block_fma(s: Value, a: list[float], b: list[float], model: Blocked, st: _Stepper) -> float:
    """One block of `models.Blocked`, straight from its definition: align s and the exact
    products to the largest exponent, truncate, sum exactly, round once."""
    prods = [st.product(x, y) for x, y in zip(a, b)]
    if any(isinstance(v, float) and not math.isfinite(v) for v in (s, *prods)):
        out = s
        for t in prods:
            out = add_exact(out, t)
        return float(out)
    acc, emin = as_format(model.accumulator), as_format(model.input).emin
    exps: list[int] = []
    if s != 0:
        e = _exponent(s, acc.emin if acc.subnormals else -10**9)
        assert e is not None  # (s is nonzero)
        exps.append(e)
    for x, y, p in zip(a, b, prods):
        if p == 0:
            continue
        if model.alignment == Alignment.INPUT_EXPONENTS:
            ex, ey = _exponent(x, emin), _exponent(y, emin)
            assert ex is not None and ey is not None  # (a nonzero product of finite inputs: neither is zero)
            exps.append(ex + ey)
        else:
            exps.append(_floor_log2(abs(Fraction(p))))
    if not exps:
        return float(s) if isinstance(s, float) else 0.0
    quantum = Fraction(2) ** (max(exps) - (as_format(model.adder).precision - 1) - model.extra_bits)
    total = Fraction(0)
    for v in (s, *prods):
        v = Fraction(v)
        total += (math.trunc(v / quantum) * quantum) if model.truncate else v
    return st.rnd(total if total != 0 else 0.0, model.block_format)


def _blocked(a: list[float], b: list[float], c: float, model: Blocked, st: _Stepper) -> float:
    """`models.Blocked` over a whole reduction: instruction by instruction, block by block."""
    step = model.step
    assert step is not None  # (`Blocked._validate` sets it: b by default)
    order = list(range(len(a)))
    if model.layout == KLayout.PAIR_INTERLEAVED:
        order = []
        for s0 in range(0, len(a), step):
            idx = range(s0, min(s0 + step, len(a)))
            order += [k for k in idx if k % 4 < 2] + [k for k in idx if k % 4 >= 2]
    a, b = [a[k] for k in order], [b[k] for k in order]
    acc = as_format(model.accumulator)
    s = st.rnd(c, acc, "nearest_even")
    for s0 in range(0, max(len(a), 1), step):
        c_in = s
        if model.c_addition == CAddition.SEPARATE:
            s = 0.0
        for j0 in range(s0, min(s0 + step, len(a)), model.b):
            j1 = min(j0 + model.b, s0 + step)
            s = _block_fma(s, a[j0:j1], b[j0:j1], model, st)
        if model.c_addition == CAddition.SEPARATE:
            s = st.rnd(add_exact(s, c_in), acc, "nearest_even")
    return s


def reduce(a: list[float], b: list[float], model: AccumulationModel, index: int = 0,
           c: float | None = None) -> float:
    """One modelled reduction of c + sum a[k] * b[k] (k in list order); `index` keys the SR
    stream; `c` (block-FMA models only) is the accumulator input."""
    if isinstance(model, (Columns, Rows)):
        raise InvalidArgument(f"{model.to_spec()} differs by {model.axis}: it computes conv2d and its "
                              f"gradients, not dot products")
    st = _Stepper(model, index)
    if isinstance(model, SplitK):
        k = len(a)
        if model.length is not None:
            size = model.length
        else:
            assert model.parts is not None  # (`SplitK._validate`: exactly one of parts and length)
            size = max(1, math.ceil(k / model.parts))
        inners = [*model.first, *[model._inner] * max(1, math.ceil(k / size))]  # the first ranges' own
        parts = [reduce(a[j0:j0 + size], b[j0:j0 + size], inners[i]) for i, j0 in enumerate(range(0, max(k, 1), size))]
        if model.combine is not None:
            return st.rnd(reduce(parts, [1.0] * len(parts), model.combine), as_format(model.output), "nearest_even")
        total: Value = 0.0
        for part in parts:
            total = st.rnd(add_exact(total, part), as_format(model.accumulator), "nearest_even")
        return st.rnd(total, as_format(model.output), "nearest_even")
    if isinstance(model, Reverse):
        return st.rnd(reduce(a[::-1], b[::-1], model._inner), as_format(model.output), "nearest_even")
    if isinstance(model, Lanes):
        head = max(len(a) - model.tail, 0)
        sums = [reduce(a[lane:head:model.width], b[lane:head:model.width], model._inner)
                for lane in range(model.width)]
        combined = reduce(sums, [1.0] * model.width, model._combine)
        if head < len(a):  # the tail after the combine, the combined sum its first term
            combined = reduce([combined, *a[head:]], [1.0, *b[head:]], model._inner)
        return st.rnd(combined, as_format(model.output), "nearest_even")
    if isinstance(model, Blocked):
        blocked = _blocked([float(v) for v in a], [float(v) for v in b], 0.0 if c is None else float(c),
                           model, st)
        return st.rnd(blocked, as_format(model.output), "nearest_even")
    terms = [st.product(float(x), float(y)) for x, y in zip(a, b)]
    if isinstance(model, Sequential):
        s: Value = 0.0
        for t in terms:
            s = st.accumulate(s, t)
    elif isinstance(model, Pairwise):
        level = list(terms)
        if not level:
            level = [0.0]
        while len(level) > 1:
            nxt: list[Value] = [st.accumulate(level[2 * j], level[2 * j + 1]) for j in range(len(level) // 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        s = level[0]
    elif isinstance(model, Chunked):
        total = 0.0
        low: Value = 0.0
        for j, t in enumerate(terms):
            low = st.accumulate(low, t)
            if (j + 1) % model.chunk == 0 or j == len(terms) - 1:
                total = st.rnd(add_exact(total, low), as_format(model.total))
                low = 0.0
        s = total
    elif isinstance(model, Exact):
        s = 0.0
        for t in terms:
            s = add_exact(s, t)
        if not (isinstance(s, float) and not math.isfinite(s)):
            s = st.rnd(s, as_format(model.accumulator))
    else:  # pragma: no cover - models are a closed set
        raise TypeError(model)
    return st.rnd(s, as_format(model.output))


def _landed(model: AccumulationModel, value: float) -> float:
    """A result as the model's kernel stores it: added onto +0 under ``zeros=positive``."""
    return float(add_exact(0.0, value)) if model.zeros == Zeros.POSITIVE else value


def _for_output(model: AccumulationModel, row: int, column: int) -> AccumulationModel:
    """The model of GEMM row `row` and output channel `column` (`Rows` differ by row,
    `Columns` by channel)."""
    if isinstance(model, Rows):
        model = model.models[min(row, len(model.models) - 1)]
    if isinstance(model, Columns):
        model = model.models[min(column, len(model.models) - 1)]
    return model


def dot(a, b, model: AccumulationModel, c=None) -> np.ndarray:
    """Scalar `dot`: reduce c + a.b along the last axis, leading axes broadcast."""
    a64 = np.asarray(a).astype(np.float64)
    b64 = np.asarray(b).astype(np.float64)
    lead = np.broadcast_shapes(a64.shape[:-1], b64.shape[:-1])
    k = a64.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    aa = np.broadcast_to(a64, (*lead, k)).reshape(rows, k)
    bb = np.broadcast_to(b64, (*lead, k)).reshape(rows, k)
    cc = None if c is None else np.broadcast_to(np.asarray(c, np.float64), lead).reshape(rows)
    out = [_landed(model, reduce(list(aa[i]), list(bb[i]), model, i, None if cc is None else float(cc[i])))
           for i in range(aa.shape[0])]
    return np.array(out, dtype=np.float64).reshape(lead).astype(model.output_dtype)


def _ordered(model: AccumulationModel, kh: int, kw: int, kc: int):
    """(i, j, c) tap triples nested as model.order, outermost first."""
    ranges = {"h": range(kh), "w": range(kw), "c": range(kc)}
    o = model.order
    for u in ranges[o[0]]:
        for v in ranges[o[1]]:
            for t in ranges[o[2]]:
                d = {o[0]: u, o[1]: v, o[2]: t}
                yield d["h"], d["w"], d["c"]


def conv2d(x, w, model: AccumulationModel, *, strides=1, padding="VALID", dilation=1,
           groups=1) -> np.ndarray:
    """Scalar forward convolution, straight from the definition."""
    x = np.asarray(x).astype(np.float64)
    w = np.asarray(w).astype(np.float64)
    (sh, sw), (dh, dw) = pair(strides, "strides"), pair(dilation, "dilation")
    n, h, wd, c = x.shape
    kh, kw, cg, cout = w.shape
    og = cout // groups
    pads = resolve_padding(padding, (h, wd), (kh, kw), (sh, sw), (dh, dw))
    oh, ow = conv_output_shape((h, wd), (kh, kw), (sh, sw), (dh, dw), pads)
    (pt, _), (pl, _) = pads
    out = np.empty((n, oh, ow, cout))
    for idx in np.ndindex(n, oh, ow, cout):
        b_, y, z, co = idx
        g = co // og
        a_terms, b_terms = [], []
        for i, j, ci in _ordered(model, kh, kw, cg):
            ih, iw = y * sh + i * dh - pt, z * sw + j * dw - pl
            inside = 0 <= ih < h and 0 <= iw < wd
            a_terms.append(x[b_, ih, iw, g * cg + ci] if inside else 0.0)
            b_terms.append(w[i, j, ci, co])
        flat = ((b_ * oh + y) * ow + z) * cout + co
        out[idx] = _landed(model, reduce(a_terms, b_terms, _for_output(model, (b_ * oh + y) * ow + z, co), flat))
    return out.astype(model.output_dtype)


def conv2d_backprop_input(dy, w, input_shape, model: AccumulationModel, *, strides=1,
                          padding="VALID", dilation=1, groups=1) -> np.ndarray:
    """Scalar input gradient: taps of the rotated filter over zero-dilated dy."""
    dy = np.asarray(dy).astype(np.float64)
    w = np.asarray(w).astype(np.float64)
    (sh, sw), (dh, dw) = pair(strides, "strides"), pair(dilation, "dilation")
    n, h, wd, c = (int(v) for v in input_shape)
    kh, kw, cg, cout = w.shape
    og = cout // groups
    pads = resolve_padding(padding, (h, wd), (kh, kw), (sh, sw), (dh, dw))
    oh, ow = dy.shape[1:3]
    dil_h, dil_w = (oh - 1) * sh + 1, (ow - 1) * sw + 1
    lo_h, lo_w = (kh - 1) * dh - pads[0][0], (kw - 1) * dw - pads[1][0]
    out = np.empty((n, h, wd, c))
    for idx in np.ndindex(n, h, wd, c):
        b_, y, z, ci = idx
        g, ci_l = divmod(ci, cg)
        a_terms, b_terms = [], []
        for i, j, co_l in _ordered(model, kh, kw, og):
            t, u = y + i * dh - lo_h, z + j * dw - lo_w
            on_grid = (0 <= t < dil_h and 0 <= u < dil_w and t % sh == 0 and u % sw == 0)
            a_terms.append(dy[b_, t // sh, u // sw, g * og + co_l] if on_grid else 0.0)
            b_terms.append(w[kh - 1 - i, kw - 1 - j, ci_l, g * og + co_l])
        flat = ((b_ * h + y) * wd + z) * c + ci
        out[idx] = _landed(model, reduce(a_terms, b_terms, _for_output(model, (b_ * h + y) * wd + z, ci), flat))
    return out.astype(model.output_dtype)


def conv2d_backprop_filter(x, dy, filter_shape, model: AccumulationModel, *, strides=1,
                           padding="VALID", dilation=1, groups=1) -> np.ndarray:
    """Scalar filter gradient: sum over (n, oh, ow) in that order, or (oh, ow, n) (positions "hwn")."""
    x = np.asarray(x).astype(np.float64)
    dy = np.asarray(dy).astype(np.float64)
    (sh, sw), (dh, dw) = pair(strides, "strides"), pair(dilation, "dilation")
    kh, kw, cg, cout = (int(v) for v in filter_shape)
    n, h, wd, c = x.shape
    og = cout // groups
    pads = resolve_padding(padding, (h, wd), (kh, kw), (sh, sw), (dh, dw))
    oh, ow = dy.shape[1:3]
    (pt, _), (pl, _) = pads
    out = np.empty((kh, kw, cg, cout))
    for idx in np.ndindex(kh, kw, cg, cout):
        i, j, ci_l, co = idx
        g = co // og
        a_terms, b_terms = [], []
        positions = (np.ndindex(n, oh, ow) if model.positions == "nhw"
                     else ((b_, y, z) for y, z, b_ in np.ndindex(oh, ow, n)))
        for b_, y, z in positions:
            ih, iw = y * sh + i * dh - pt, z * sw + j * dw - pl
            inside = 0 <= ih < h and 0 <= iw < wd
            a_terms.append(x[b_, ih, iw, g * cg + ci_l] if inside else 0.0)
            b_terms.append(dy[b_, y, z, co])
        flat = ((i * kw + j) * cg + ci_l) * cout + co
        out[idx] = _landed(model, reduce(a_terms, b_terms, _for_output(model, (i * kw + j) * cg + ci_l, co), flat))
    return out.astype(model.output_dtype)
