"""The block-FMA (tensor-core) adder in NumPy, vectorised across outputs.

The fast twin of the block-FMA branch of `convprobe.emulation.oracle`, which computes
the same definition (`models.Blocked`) one output at a time in exact rationals; GEMMs
in the common case go on to the compiled kernel of `_block_fma_compiled`. Why
float64 is exact here: every product of two inputs of at most 26 significand bits is
exact; scaling by a power of two (`ldexp`) is exact; after truncation each addend is an
integer multiple of the quantum below 2**(p_adder + extra + 1), and the model checks
that b + 1 of them sum below 2**53. The rounding to the accumulator is
`rounding.round_to_format`, the emulator's one rounding routine.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from convprobe.emulation import _block_fma_compiled as kernel
from convprobe.emulation._kernel_arithmetic import NO_EXPONENT as _NONE  # the exponent of a zero addend
from convprobe.emulation.rounding import round_to_format
from convprobe.errors import InvalidArgument
from convprobe.options import Alignment, CAddition, KLayout, Rounding

__all__ = ["reduce_rows", "gemm", "step_order"]

_GEMM_ELEMENTS = 1 << 22  # outputs x block terms per slice of rows, bounding memory


def step_order(k: int, model) -> np.ndarray:
    """The order in which the K products enter the adder (see `options.KLayout`)."""
    order = np.arange(k)
    if model.layout == KLayout.PAIR_INTERLEAVED:
        step = model.step
        for s0 in range(0, k, step):
            idx = np.arange(s0, min(s0 + step, k))
            order[s0:s0 + idx.size] = np.concatenate([idx[(idx % 4) < 2], idx[(idx % 4) >= 2]])
    return order


def _floor_log2(x: np.ndarray, emin: int | None = None) -> np.ndarray:
    """floor(log2|x|) as int64 (clamped below at emin); _NONE for zeros and non-finite."""
    with np.errstate(invalid="ignore"):
        _, e = np.frexp(x)
    e = e.astype(np.int64) - 1
    if emin is not None:
        e = np.maximum(e, emin)
    return np.where((x != 0) & np.isfinite(x), e, _NONE)


def _check_inputs(x: np.ndarray, model, argument: str) -> None:
    fmt = model.input
    finite = x[np.isfinite(x)]
    if finite.size and not np.array_equal(round_to_format(finite, fmt), finite):
        raise InvalidArgument(f"{argument} holds values that are not {fmt.name} numbers, the "
                              f"input format of {model.to_spec()}; round them to {fmt.name} or "
                              f"choose input=<format>")


def _round(x: np.ndarray, fmt, model, mode) -> np.ndarray:
    return round_to_format(x, fmt, mode, subnormals=model.subnormals, overflow=model.overflow)


def _add_odd(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y rounded to odd in float64 (TwoSum, then the last bit fixed): rounding this once
    more to a format of at most 51 bits is the correctly rounded sum."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = x + y
        bb = s - x
        err = (x - (s - bb)) + (y - bb)
    bits = s.view(np.int64).copy()
    fix = np.isfinite(s) & (err != 0)
    toward = fix & ((s < 0) != (err < 0))
    bits[toward] -= 1
    bits[fix] |= 1
    return bits.view(np.float64)


def _block(s, prods, exps, model, fmt):
    """One block: s (...) plus prods (..., m) with alignment exponents exps, rounded."""
    acc = model.accumulator
    es = _floor_log2(s, acc.emin if acc.subnormals else None)
    top = np.maximum(exps.max(axis=-1), es)
    special = ~np.isfinite(s) | ~np.isfinite(prods).all(axis=-1)
    live = (top != _NONE) & ~special
    q = np.where(live, top - (model.adder.precision - 1) - model.extra_bits, 0)
    with np.errstate(invalid="ignore", over="ignore"):
        if model.truncate:
            total = np.trunc(np.ldexp(s, -q)) + np.trunc(np.ldexp(prods, -q[..., None])).sum(-1)
            value = np.where(total == 0, 0.0, np.ldexp(total, q))  # an exact zero sum is +0
        else:
            value = _exact_sums(s, prods)
        out = np.where(live, _round(np.where(live, value, 0.0), fmt, model, model.rounding), s)
        if special.any():
            ieee = s + prods.sum(axis=-1)
            out = np.where(special, ieee, out)
    return out


def _exact_sums(s: np.ndarray, prods: np.ndarray) -> np.ndarray:
    """s + sum(prods) rounded to odd at 53 bits (exact rationals; the `truncate=False`
    model, which no published GPU needs)."""
    flat_s, flat_p = s.reshape(-1), prods.reshape(-1, prods.shape[-1])
    out = np.zeros(flat_s.shape)
    for i in range(flat_s.size):
        if not (np.isfinite(flat_s[i]) and np.isfinite(flat_p[i]).all()):
            continue  # an inf or NaN row: `_block` takes the IEEE sum instead
        total = Fraction(float(flat_s[i])) + sum(Fraction(float(v)) for v in flat_p[i])
        out[i] = _to_odd(total)
    return out.reshape(s.shape)


def _to_odd(v: Fraction) -> float:
    if v == 0:
        return 0.0
    mag = abs(v)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** e > mag:
        e -= 1
    scaled = mag / Fraction(2) ** (e - 52)
    kept = math.floor(scaled)
    if kept != scaled:
        kept |= 1
    out = math.ldexp(kept, e - 52)
    return -out if v < 0 else out


def _reduce(a, b, c, model, ea, eb):
    """The reduction of broadcast (..., K) operands with precomputed input exponents."""
    k = a.shape[-1]
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    fmt = model.block_format
    acc = model.accumulator
    c = np.zeros(shape) if c is None else np.broadcast_to(c, shape).astype(np.float64)
    s = _round(c, acc, model, Rounding.NEAREST_EVEN)
    separate = model.c_addition == CAddition.SEPARATE
    for s0 in range(0, max(k, 1), model.step):
        c_in = s
        if separate:
            s = np.zeros(shape)
        for j0 in range(s0, min(s0 + model.step, k), model.b):
            j1 = min(j0 + model.b, k, s0 + model.step)
            with np.errstate(invalid="ignore", over="ignore"):
                prods = a[..., j0:j1] * b[..., j0:j1]
            if model.product != "exact":
                prods = _round(prods, model.product, model, Rounding.NEAREST_EVEN)
            if model.alignment == Alignment.INPUT_EXPONENTS:
                exps = ea[..., j0:j1] + eb[..., j0:j1]
                exps = np.where((ea[..., j0:j1] == _NONE) | (eb[..., j0:j1] == _NONE), _NONE, exps)
            else:
                exps = _floor_log2(prods)
            exps = np.where(prods == 0, _NONE, exps)  # a zero product takes no part in alignment
            s = _block(s, prods, np.broadcast_to(exps, prods.shape), model, fmt)
        if separate:  # one nearest rounding of s + c: native for fp64, else via round-to-odd
            total = s + c_in if acc.precision > 51 else _add_odd(s, c_in)
            s = _round(total, acc, model, Rounding.NEAREST_EVEN)
    return _round(s, model.output, model, Rounding.NEAREST_EVEN)


def _prepared(x: np.ndarray, model, argument: str) -> tuple[np.ndarray, np.ndarray]:
    _check_inputs(x, model, argument)
    return x, _floor_log2(x, model.input.emin)


def reduce_rows(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, model) -> np.ndarray:
    """out[r] = c[r] + sum_k a[r, k] * b[r, k] under `model` (a, b (R, K) float64)."""
    order = step_order(a.shape[-1], model)
    a, ea = _prepared(a[..., order], model, "a")
    b, eb = _prepared(b[..., order], model, "b")
    return _reduce(a, b, c, model, ea, eb)


def dot_rows(a: np.ndarray, b: np.ndarray, model) -> np.ndarray:
    """`reduce_rows` from +0 (no c) as `dot` runs it, on inputs the caller has checked
    (`check_inputs`; float64, or float32 where `Blocked.carrier` says so): by the compiled
    32-bit kernel where it applies (fp16/fp8 inputs), rows of tiles holding an inf or NaN
    and other models by `reduce_rows` itself in float64 (the tests compare both)."""
    fast = None
    if kernel.applies(model):
        order = step_order(a.shape[-1], model)
        in_order = np.array_equal(order, np.arange(order.size))
        fast = kernel.rows(np.ascontiguousarray(a if in_order else a[:, order]),
                           np.ascontiguousarray(b if in_order else b[:, order]), model)
    if fast is None:
        return reduce_rows(np.asarray(a, np.float64), np.asarray(b, np.float64), None, model)
    out, skipped = fast
    out = _to_output(out, model)
    if skipped.size:
        out[skipped] = reduce_rows(np.asarray(a[skipped], np.float64), np.asarray(b[skipped], np.float64), None, model)
    return out


def _to_output(out: np.ndarray, model) -> np.ndarray:
    """The compiled kernel's results (accumulator values) in the output format."""
    return out if _output_is_identity(model) else _round(out, model.output, model, Rounding.NEAREST_EVEN)


def _output_is_identity(model) -> bool:
    """Whether rounding the kernel's results (values of the block and accumulator formats)
    to the output format changes nothing: the output holds both, infinities included, and
    flushes nothing."""
    out = model.output
    return all(out.holds(fmt) and (out.has_inf or not fmt.has_inf)
               and (model.subnormals == "keep" or out.emin <= fmt.emin)
               for fmt in (model.block_format, model.accumulator))


def gemm(a: np.ndarray, w: np.ndarray, model, compiled: bool = True,
         inputs_checked: bool = False) -> np.ndarray:
    """out[m, n] = sum_k a[m, k] * w[k, n] under `model` (a (M, K), w (K, N) float64, or
    float32 where `model.carrier` says so); `compiled`: use the compiled kernel where it
    applies (the tests compare both paths); `inputs_checked`: the caller knows every value
    is in the model's input format."""
    if not (compiled and kernel.applies(model)):
        a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
    order = step_order(a.shape[1], model)
    permuted = not np.array_equal(order, np.arange(order.size))
    if compiled and kernel.applies(model):
        if not inputs_checked:
            _check_inputs(a, model, "x")
            _check_inputs(w, model, "w")
        a, w = (a[:, order], w[order]) if permuted else (a, w)
        return _to_output(kernel.gemm(a, w, model), model)
    a, ea = _prepared(np.ascontiguousarray(a[:, order]), model, "x")
    wt, ewt = _prepared(np.ascontiguousarray(w.T[:, order]), model, "w")
    m, n = a.shape[0], wt.shape[0]
    out = np.empty((m, n))
    rows = max(1, _GEMM_ELEMENTS // max(1, n * model.b))
    for r0 in range(0, m, rows):
        sl = slice(r0, r0 + rows)
        out[sl] = _reduce(a[sl, None, :], wt[None], None, model, ea[sl, None, :], ewt[None])
    return out
