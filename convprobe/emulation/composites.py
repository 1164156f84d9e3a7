"""Composite models: real GEMM and convolution kernels built from inner models.

One file, over 600 lines: the composites nest one another and share one frame
(`_Composite`); issue 60 splits the emulation package by concept.

* `SplitK` - K cut into `parts` contiguous ranges (``ceil(K / parts)`` terms each, the
  last shorter), or into ranges of `length` terms; each range is reduced by `inner`
  from +0 (its result in the inner model's output format), and the partial results
  are summed in order into a running total in `combine` (nearest even, from +0), as
  split-K GEMMs and chunked CPU kernels combine their slices; or, with a model as
  `combine` (``combine=pairwise:fp32``), reduced by that model, as a tree of chunk sums.
  ``first=M0 | M1 | ...`` gives the first ranges models of their own (range i < n takes
  Mi, the rest `inner`): a kernel whose slices are not all computed alike.
  With the sequential fp16 model inside, combined in fp32, on fp16 inputs, one compiled
  kernel computes ranges and total (`_native_fp16.chunked_gemm_fp32_total`).
* `Lanes` - the terms dealt round-robin to `width` accumulators (term k to lane
  k mod width), each lane reduced by `inner`, and the lane results then reduced, in
  lane order, by the model `combine` (as products with 1): what a SIMD reduction over
  the contracted axis does. With the sequential fp32 model inside and a float32 combine,
  on fp16 inputs, one compiled kernel runs both on the CPU's float32 arithmetic
  (`_native_fp32.lanes_gemm`). ``tail=N`` keeps the last N terms out of the lanes: they
  are added after the combine by `inner` (a plain model), the combined sum its first term,
  as a depth loop unrolled into lanes finishes its remainder on one accumulator.
* `Columns` - output channel j (the GEMM's column) reduced by ``models[min(j, n - 1)]``:
  a GEMM whose micro kernels differ by column block; ``MODEL * N`` stands for N columns
  in a row (``columns(sequential:fp16:product=fp16 * 16, sequential:fp16)``). Eigen's fp16 input gradient
  (col = dy x filter^T, KH*KW*C columns) rounds products and adds in fp16 in whole blocks
  of 16 columns, sums the next block of 8 in two interleaved lanes, and adds the last
  columns' exact products in fp16; each dx channel then meets its taps' columns in turn
  (`columns(splitk(length=C_out, ..., first=...), ...)`, as ``identify`` measures it,
  `convprobe.identify.column_patterns`).
* `Rows` - GEMM row r reduced by ``models[min(r, n - 1)]``, each a plain model or a
  `Columns`: a kernel picked by (row block, column block). The rows are the outputs'
  positions (forward: (n, oh, ow); filter gradient: the tap (i, j, c)). Eigen's fp16
  GEMM finishes the rows beyond its last whole block of 4 one at a time on another micro
  kernel (``rows(lanes(...) * 48, sequential:fp16:product=fp16)`` at 49 output pixels,
  as ``identify`` measures it, `convprobe.identify.tile_patterns`).
* `Reverse` - the terms reduced by `inner` from the last to the first, as a fold that
  adds each accumulator into the next one's sum does (Eigen's inner product combines its
  packet accumulators as ``p0 + (p1 + (p2 + p3))``).

Inner models may be any model, tensor-core presets and other composites included, but
not stochastically rounded ones (their random streams are keyed per output of one
reduction), nor `Columns` or `Rows` (they pick by output index, so they are the outermost:
rows around columns), nor
models that set ``positions``: a filter gradient's order over (n, oh, ow) is the whole
sum's, so the outermost model sets it (``lanes(2, ..., positions=hwn)``). Spec grammar (see `specs.parse_model`): ``splitk(4, a100, combine=fp16)``,
``splitk(length=1024, sequential:fp16, combine=fp32)``,
``lanes(8, sequential:fp32, combine=pairwise:fp32)``,
``lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16, tail=1)``, ``reverse(sequential:fp16)``,
``splitk(length=16, sequential:fp16:product=fp16, first=sequential:fp16 | pairwise:fp16, combine=fp16)``,
``columns(sequential:fp16, sequential:fp32:output=fp16)``,
``rows(columns(sequential:fp16:product=fp16 * 16, sequential:fp16) * 48, sequential:fp16)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from convprobe.emulation import _kernels as K
from convprobe.emulation import _native_fp16, _native_fp32, plan
from convprobe.emulation._native_fp16 import convert
from convprobe.emulation.models import (AccumulationModel, Chunked, Exact, Pairwise, Sequential, as_format,
                                       kernel_config, sum_terms_as_rows)
from convprobe.emulation.rounding import resolve_format, round_to_format
from convprobe.errors import InvalidArgument, invalid_choice, is_integer, set_once
from convprobe.formats import FP32, Format
from convprobe.options import Positions, Rounding, Zeros

__all__ = ["SplitK", "Lanes", "Reverse", "Columns", "Rows", "COMPOSITE_KINDS", "ranges", "split_arguments",
           "parse_composite"]


def _reduced_by(model: AccumulationModel, values: list[np.ndarray]) -> np.ndarray:
    """The values (one array per term, in order) reduced by `model`, as products with 1."""
    return np.asarray(model.sum_terms(np.stack([np.asarray(v, np.float64).reshape(-1) for v in values])),
                      np.float64)


def _inner_gemm(model: AccumulationModel, a: np.ndarray, w: np.ndarray, inputs_fp16: bool) -> np.ndarray:
    """`model`'s GEMM of a (M, K) against w (K, N) as float64, run in the dtype its kernel
    takes (`model.carrier`; exact: the values are fp16 numbers where it is float16)."""
    dtype = model.carrier(inputs_fp16)
    out: np.ndarray = np.empty((a.shape[0], w.shape[1]), dtype=dtype)
    model.gemm_into(convert(a, dtype), convert(w, dtype), out, 0, inputs_fp16)
    return convert(out, np.float64)


def _planned(model: AccumulationModel, a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int) -> bool:
    """Run the composite's whole program (`plan`) where it compiles, on float32 carriers
    (fp16 values); whether it did."""
    if a.dtype != np.float32 or out.dtype != np.float32 or not model.plannable():
        return False
    program = model.program(a.shape[1])
    if not plan.fits_memory(program, w.shape[1]):  # (thousands of ranges: composed part by part)
        return False
    plan.run(program, a, w, out, col0)
    return True


def _check_inner(model: AccumulationModel, argument: str) -> None:
    if not isinstance(model, AccumulationModel):
        raise InvalidArgument(f"{argument} must be a model; received {model!r}")
    if model.rounding == Rounding.STOCHASTIC:
        raise InvalidArgument(f"{argument} of a composite cannot round stochastically; received "
                              f"{model.to_spec()}")
    if model.positions != Positions.NHW:
        raise InvalidArgument(f"{argument} of a composite cannot set positions (the order of the whole "
                              f"sum, the outermost model's); received {model.to_spec()}")
    if model.zeros != Zeros.SIGNED:
        raise InvalidArgument(f"{argument} of a composite cannot set zeros (the sign of the whole sum's zero "
                              f"result, the outermost model's); received {model.to_spec()}")
    if isinstance(model, _ByIndex):
        raise InvalidArgument(f"{argument} of a composite cannot be a {model.kind} model (it picks a model by "
                              f"{model.axis}, so it is the outermost, rows around columns); received "
                              f"{model.to_spec()}")


@dataclass(frozen=True)
class _Composite(AccumulationModel):
    """Common frame: `accumulator` is the combining format, `output` the result's."""

    inner: AccumulationModel | None = field(default=None, kw_only=True)

    def _validate(self) -> None:
        if self.inner is None:
            raise InvalidArgument(f"{self.kind} needs an inner model")
        self._check_model(self.inner)
        if self.product != "exact" or self.addition != "exact":
            raise InvalidArgument(f"{self.kind}: set product and addition on the inner model")
        if self.rounding != Rounding.NEAREST_EVEN:
            raise InvalidArgument(f"{self.kind} combines with nearest-even rounding; set rounding "
                                  f"on the inner model")

    @property
    def _inner(self) -> AccumulationModel:
        """`inner` as read after construction (the constructor takes None for "not given";
        `_validate` refuses it)."""
        assert self.inner is not None
        return self.inner

    def _check_model(self, model: AccumulationModel) -> None:
        _check_inner(model, "inner")

    def _parts(self) -> tuple[AccumulationModel, ...]:
        """The models whose steps this composite's program writes."""
        return (self._inner,)

    def plannable(self) -> bool:
        """Whether the whole composite compiles (`plan`): its own options and every part."""
        return plan.plannable(self) and all(model.plannable() for model in self._parts())

    def _order(self) -> str:
        """The spec's options of the whole sum: ``, positions=hwn`` where it takes the batch
        innermost, ``, zeros=positive`` where a zero result is +0."""
        return ("" if self.positions == Positions.NHW else f", positions={self.positions}") + (
            "" if self.zeros == Zeros.SIGNED else f", zeros={self.zeros}")

    def check_inputs(self, x: np.ndarray, fp16_dtype: bool, argument: str) -> None:
        self._inner.check_inputs(x, fp16_dtype, argument)

    def carrier(self, inputs_fp16: bool) -> type:
        """float32 for fp16 inputs where float32 holds the output (im2col moves half the
        bytes of float64; each inner model then takes its own carrier: `_inner_gemm`),
        else float64."""
        return np.float32 if inputs_fp16 and FP32.holds(as_format(self.output)) else np.float64

    def sum_terms(self, terms: np.ndarray) -> np.ndarray:
        return sum_terms_as_rows(self, terms)

    def _summed_formats(self) -> list[tuple[Format, str]]:
        return [(as_format(self.accumulator), "combine")]

    def _describe_kind(self) -> str:
        raise NotImplementedError

    def _produced(self) -> Format:
        """The format the combining step leaves its results in."""
        return as_format(self.accumulator)

    def _finish(self, out: np.ndarray) -> np.ndarray:
        if self.output == self._produced():
            return out
        return round_to_format(out, as_format(self.output), Rounding.NEAREST_EVEN, subnormals=self.subnormals,
                               overflow=self.overflow)


def range_length(k: int, parts: int | None, length: int | None) -> int:
    """The length of a split's ranges (the last may be shorter): ceil(k/parts), or `length`."""
    if length is not None:
        return length
    assert parts is not None, "a split has parts or a length"
    return max(1, -(-k // parts))


def ranges(k: int, parts: int | None, length: int | None) -> list[tuple[int, int]]:
    """The contiguous K ranges of a split: `parts` of ceil(k/parts), or runs of `length`."""
    step = range_length(k, parts, length)
    return [(j, min(j + step, k)) for j in range(0, max(k, 1), step)] if k else [(0, 0)]


@dataclass(frozen=True)
class SplitK(_Composite):
    """Contiguous K ranges reduced by `inner`, partial results summed in `combine`."""

    accumulator: Format | str = FP32
    parts: int | None = field(default=None, kw_only=True)
    length: int | None = field(default=None, kw_only=True)
    #: A model that reduces the partial results (in range order) instead of a running total.
    combine: AccumulationModel | None = field(default=None, kw_only=True)
    #: The models of the first ranges, in order (the rest take `inner`).
    first: tuple[AccumulationModel, ...] = field(default=(), kw_only=True)

    kind: ClassVar[str] = "splitk"

    def __post_init__(self) -> None:
        if self.combine is not None:
            _check_inner(self.combine, "combine")
            object.__setattr__(self, "accumulator", self.combine.accumulator)
            if self.output is None:
                object.__setattr__(self, "output", self.combine.output)
        super().__post_init__()

    def _validate(self) -> None:
        super()._validate()
        if (self.parts is None) == (self.length is None):
            raise InvalidArgument("splitk needs exactly one of parts (ranges) or length (terms "
                                  f"per range); received parts={self.parts!r}, length={self.length!r}")
        for name in ("parts", "length"):
            value = getattr(self, name)
            if value is not None and (not is_integer(value)
                                      or value < 1):
                raise InvalidArgument(f"{name} must be an integer >= 1; received {value!r}")
        object.__setattr__(self, "first", tuple(self.first))
        for model in self.first:
            _check_inner(model, "first")

    def check_inputs(self, x: np.ndarray, fp16_dtype: bool, argument: str) -> None:
        for model in (self._inner, *self.first):
            model.check_inputs(x, fp16_dtype, argument)

    def range_model(self, i: int) -> AccumulationModel:
        """The model that reduces range i (`first` longer than the ranges: its extra models
        go unused)."""
        return self.first[i] if i < len(self.first) else self._inner

    def to_spec(self) -> str:
        size = str(self.parts) if self.parts is not None else f"length={self.length}"
        inner = self._inner.to_spec()
        if self.first:
            size += f", {inner}, first={' | '.join(m.to_spec() for m in self.first)}"
        else:
            size += f", {inner}"
        output = as_format(self.output)
        if self.combine is not None:
            extra = "" if output == self.combine.output else f", output={output.name}"
            return f"splitk({size}, combine={self.combine.to_spec()}{extra}{self._order()})"
        extra = "" if output == self.accumulator else f", output={output.name}"
        return f"splitk({size}, combine={as_format(self.accumulator).name}{extra}{self._order()})"

    @property
    def name(self) -> str:
        return self.to_spec()

    def _describe_kind(self) -> str:
        size = (f"{self.parts} contiguous K ranges" if self.parts is not None
                else f"K ranges of {self.length} terms")
        combined = (f"reduced as [{self.combine.describe()}]" if self.combine is not None
                    else f"summed in {self.accumulator}")
        own = "".join(f"range {i} as [{m.describe()}], " for i, m in enumerate(self.first))
        rest = "the others" if self.first else "each"
        return (f"split-K: {size}, {own}{rest} reduced as [{self._inner.describe()}], the partial "
                f"results {combined}")

    def reduce_rows(self, a, b, c):
        if c is not None:
            raise InvalidArgument("c (an accumulator input) is not defined for splitk models")
        parts = [np.asarray(self.range_model(i).reduce_rows(np.ascontiguousarray(a[:, j0:j1]),
                                                            np.ascontiguousarray(b[:, j0:j1]), None), np.float64)
                 for i, (j0, j1) in enumerate(ranges(a.shape[1], self.parts, self.length))]
        return self._finish(self._combined(parts))

    def _produced(self) -> Format:
        return as_format(self.accumulator if self.combine is None else self.combine.output)

    def _combined(self, parts: list[np.ndarray]) -> np.ndarray:
        return _reduced_by(self._combine_model(), parts).reshape(parts[0].shape)

    def _fp16_ranges_fp32_total(self, inputs_fp16: bool) -> bool:
        """Whether `_native_fp16.chunked_gemm_fp32_total` computes the partial sums and
        their combination: the inner model one that the CPU's fp16 arithmetic (or F16C and
        float32) computes, sequential with nearest even (`_kernels.native_fp16`), combined
        in fp32 (a format), subnormals kept, overflow to inf."""
        own, own_ic, _ = kernel_config(self)
        if (self.combine is not None or self.first or not K.same_format(own[K.ACCUMULATOR], FP32)
                or own[K.ACCUMULATOR, K.F_KEEP_SUB] == 0.0 or own_ic[K.IC_SAT] != 0):
            return False
        fp, ic, _ = kernel_config(self._inner)
        return ic[K.IC_KIND] == K.SEQUENTIAL and ic[K.IC_MODE] == K.NEAREST_EVEN and K.native_fp16(fp, ic, inputs_fp16)

    def _combine_model(self) -> AccumulationModel:
        return self.combine if self.combine is not None else Sequential(
            accumulator=self.accumulator, subnormals=self.subnormals, overflow=self.overflow)

    def _parts(self) -> tuple[AccumulationModel, ...]:
        return (self._inner, *self.first, self._combine_model())

    def emit(self, steps, items, register):
        """Each range's sum in a register above `register`, then the combine over them in
        the register above those."""
        spans = ranges(len(items), self.parts, self.length)
        for i, (j0, j1) in enumerate(spans):
            self.range_model(i).emit(steps, items[j0:j1], register + 1 + i)
        top = register + 1 + len(spans)
        self._combine_model().emit(steps, [plan.Partial(register + 1 + i) for i in range(len(spans))], top)
        steps.take(self, register, plan.Partial(top))
        steps.round(self, register, self.output)

    def gemm_into(self, a, w, out, col0, inputs_fp16):
        n = w.shape[1]
        if out.dtype == np.float32 and self._fp16_ranges_fp32_total(inputs_fp16):
            totals = np.empty((a.shape[0], n), np.float32)
            add32 = kernel_config(self._inner)[0][K.ADDITION, K.F_PRECISION] != 0.0
            _native_fp16.chunked_gemm_fp32_total(convert(a, np.float16), convert(w, np.float16), totals, 0,
                                                 add32=add32, chunk=range_length(a.shape[1], self.parts, self.length))
            out[:, col0:col0 + n] = self._finish(totals)
            return
        if _planned(self, a, w, out, col0):
            return
        parts = [_inner_gemm(self.range_model(i), a[:, j0:j1], w[j0:j1], inputs_fp16)
                 for i, (j0, j1) in enumerate(ranges(a.shape[1], self.parts, self.length))]
        out[:, col0:col0 + n] = self._finish(self._combined(parts))


@dataclass(frozen=True)
class Lanes(_Composite):
    """Terms k mod `width` reduced by `inner` per lane; the lanes reduced by `combine`.

    `tail`: the last `tail` terms stay out of the lanes and are added after the combine,
    by `inner` with the combined sum as its first term: a kernel that unrolls its depth
    loop into lanes and finishes the remainder on the one accumulator (Eigen's GEMM micro
    kernel peels the depth by 8 and adds K mod 8 terms after folding its two lanes)."""

    width: int = 4
    combine: AccumulationModel | None = field(default=None, kw_only=True)
    tail: int = field(default=0, kw_only=True)

    kind: ClassVar[str] = "lanes"

    def __post_init__(self) -> None:
        if self.combine is None:
            raise InvalidArgument("lanes needs a combine model (how the lane sums are reduced)")
        _check_inner(self.combine, "combine")
        object.__setattr__(self, "accumulator", self.combine.accumulator)
        if self.output is None:
            object.__setattr__(self, "output", self._produced())
        super().__post_init__()

    @property
    def _combine(self) -> AccumulationModel:
        """`combine` as read after construction (`__post_init__` refuses None)."""
        assert self.combine is not None
        return self.combine

    def _validate(self) -> None:
        super()._validate()
        if not is_integer(self.width) or self.width < 1:
            raise InvalidArgument(f"width must be an integer >= 1; received {self.width!r}")
        if not is_integer(self.tail) or self.tail < 0:
            raise InvalidArgument(f"tail must be an integer >= 0; received {self.tail!r}")
        if self.tail and not isinstance(self.inner, (Sequential, Pairwise, Chunked, Exact)):
            raise InvalidArgument(f"inner must be a plain model (sequential, pairwise, chunked or exact) when "
                                  f"tail is set; received inner={self._inner.to_spec()}")
        product = self._inner.product
        if self.tail and isinstance(product, Format) and not product.holds(as_format(self._combine.output)):
            # the combined sum enters the tail as a product with 1: a narrower product format would round it
            raise InvalidArgument(f"the inner model's product format must hold the combine's output "
                                  f"({as_format(self._combine.output).name}) when tail is set; received "
                                  f"product={product.name}")

    def to_spec(self) -> str:
        extra = "" if self.output == self._produced() else f", output={as_format(self.output).name}"
        tail = f", tail={self.tail}" if self.tail else ""
        return f"lanes({self.width}, {self._inner.to_spec()}, combine={self._combine.to_spec()}{tail}{extra}{self._order()})"

    @property
    def name(self) -> str:
        return self.to_spec()

    def _describe_kind(self) -> str:
        return (f"{self.width} interleaved lanes (term k to lane k mod {self.width}), each "
                f"reduced as [{self._inner.describe()}], then the lanes as "
                f"[{self._combine.describe()}]"
                + (f"; the last {self.tail} terms then added by the inner model" if self.tail else ""))

    def _produced(self) -> Format:
        return as_format(self._inner.output if self.tail else self._combine.output)

    def _combined(self, sums: list[np.ndarray]) -> np.ndarray:
        return _reduced_by(self._combine, sums)

    def _head(self, k: int) -> int:
        """How many leading terms go into the lanes."""
        return max(k - self.tail, 0)

    def _with_tail(self, combined: np.ndarray, a_tail: np.ndarray, b_tail: np.ndarray) -> np.ndarray:
        """The tail's rows reduced by `inner`, the combined sum (one per row) their first term."""
        if a_tail.shape[1] == 0:
            return combined
        ones = np.ones((len(combined), 1))
        return self._inner.reduce_rows(np.hstack([combined.reshape(-1, 1), a_tail]),
                                      np.hstack([ones, b_tail]), None)

    def reduce_rows(self, a, b, c):
        if c is not None:
            raise InvalidArgument("c (an accumulator input) is not defined for lanes models")
        head = self._head(a.shape[1])
        sums = [self._inner.reduce_rows(np.ascontiguousarray(a[:, lane:head:self.width]),
                                       np.ascontiguousarray(b[:, lane:head:self.width]), None)
                for lane in range(self.width)]
        combined = self._combined(sums)
        return self._finish(self._with_tail(combined, np.asarray(a[:, head:], np.float64),
                                            np.asarray(b[:, head:], np.float64)))

    def _float32_lanes(self, inputs_fp16: bool) -> bool:
        """Whether the CPU's float32 arithmetic computes the lanes and their combination
        (`_native_fp32.lanes_gemm`): fp16 inputs, the inner model the float32 FMA
        (`_kernels.native_fp32`), the combine float32 additions (`_kernels.float32_sums`)."""
        (fp, ic, _), (cfp, cic, _) = kernel_config(self._inner), kernel_config(self._combine)
        return K.native_fp32(fp, ic, inputs_fp16) and K.float32_sums(cfp, cic)

    def _parts(self) -> tuple[AccumulationModel, ...]:
        return (self._inner, self._combine)

    def emit(self, steps, items, register):
        """Each lane's sum in a register above `register`, the combine over them in the
        register above those, and the tail after it with the combined sum first."""
        head = self._head(len(items))
        top = register + 1 + self.width
        if head:
            for lane in range(self.width):
                self._inner.emit(steps, items[lane:head:self.width], register + 1 + lane)
            self._combine.emit(steps, [plan.Partial(register + 1 + lane) for lane in range(self.width)], top)
        else:
            steps.zero(top)
        if head < len(items):
            self._inner.emit(steps, [plan.Partial(top), *items[head:]], top + 1)
            top += 1
        steps.take(self, register, plan.Partial(top))
        steps.round(self, register, self.output)

    def gemm_into(self, a, w, out, col0, inputs_fp16):
        m, n = a.shape[0], w.shape[1]
        head = self._head(a.shape[1])
        a_head, w_head = a[:, :head], w[:head]
        if head == 0:
            combined = np.zeros(m * n)
        elif a.dtype == np.float32 and self._float32_lanes(inputs_fp16):
            sums = np.empty((m, n), np.float32)
            pairwise = kernel_config(self._combine)[1][K.IC_KIND] == K.PAIRWISE
            _native_fp32.lanes_gemm(np.ascontiguousarray(a_head), np.ascontiguousarray(w_head), self.width, pairwise,
                                    sums, 0)
            combined = sums if self._combine.output == FP32 else round_to_format(
                sums, self._combine.output, Rounding.NEAREST_EVEN, subnormals=self._combine.subnormals,
                overflow=self._combine.overflow)
            combined = np.asarray(combined, np.float64).reshape(-1)
        elif _planned(self, a, w, out, col0):
            return
        else:
            sums = [_inner_gemm(self._inner, a_head[:, lane::self.width], w_head[lane::self.width], inputs_fp16)
                    for lane in range(self.width)]
            combined = self._combined(sums)
        if head < a.shape[1]:  # row (i, j) of the tail: a[i, head:] against w[head:, j]
            a_tail = np.repeat(np.asarray(a[:, head:], np.float64), n, axis=0)
            w_tail = np.tile(np.asarray(w[head:], np.float64).T, (m, 1))
            combined = self._with_tail(combined, a_tail, w_tail)
        out[:, col0:col0 + n] = self._finish(combined).reshape(m, n)


@dataclass(frozen=True)
class Reverse(_Composite):
    """The terms reduced by `inner` in reverse index order (K-1 first)."""

    kind: ClassVar[str] = "reverse"

    def __post_init__(self) -> None:
        if isinstance(self.inner, AccumulationModel):
            object.__setattr__(self, "accumulator", self.inner.accumulator)
            if self.output is None:
                object.__setattr__(self, "output", self.inner.output)
        super().__post_init__()

    def to_spec(self) -> str:
        extra = "" if self.output == self._inner.output else f", output={as_format(self.output).name}"
        return f"reverse({self._inner.to_spec()}{extra}{self._order()})"

    @property
    def name(self) -> str:
        return self.to_spec()

    def _describe_kind(self) -> str:
        return f"the terms from last to first, reduced as [{self._inner.describe()}]"

    def _produced(self) -> Format:
        return as_format(self._inner.output)

    def reduce_rows(self, a, b, c):
        if c is not None:
            raise InvalidArgument("c (an accumulator input) is not defined for reverse models")
        out = self._inner.reduce_rows(np.ascontiguousarray(a[:, ::-1]), np.ascontiguousarray(b[:, ::-1]), None)
        return self._finish(np.asarray(out, np.float64))

    def emit(self, steps, items, register):
        self._inner.emit(steps, items[::-1], register)
        steps.round(self, register, self.output)

    def gemm_into(self, a, w, out, col0, inputs_fp16):
        if _planned(self, a, w, out, col0):
            return
        out[:, col0:col0 + w.shape[1]] = self._finish(_inner_gemm(self._inner, a[:, ::-1], w[::-1], inputs_fp16))


@dataclass(frozen=True)
class _ByIndex(_Composite):
    """Index i of one GEMM axis reduced by ``models[min(i, n - 1)]`` (all with one output
    format): a kernel whose micro kernels differ by block of that axis."""

    models: tuple[AccumulationModel, ...] = field(default=(), kw_only=True)

    #: What the index counts, for messages and descriptions.
    axis: ClassVar[str] = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        if not self.models:
            raise InvalidArgument(f"{self.kind} needs at least one model")
        for model in self.models:
            self._check_model(model)
        outputs = {as_format(m.output).name for m in self.models}
        if len(outputs) > 1:
            raise InvalidArgument(f"{self.kind}' models must share one output format; received {sorted(outputs)}")
        if self.output is not None and resolve_format(self.output, "output") != self.models[0].output:
            raise InvalidArgument(f"{self.kind}' output is its models' own ({as_format(self.models[0].output).name}); set "
                                  f"output on the models; received output={self.output!r}")
        object.__setattr__(self, "inner", self.models[0])
        object.__setattr__(self, "accumulator", self.models[0].output)
        object.__setattr__(self, "output", self.models[0].output)
        super().__post_init__()

    def _check_model(self, model: AccumulationModel) -> None:
        _check_inner(model, f"a {self.kind} model")

    def plannable(self) -> bool:
        """No: one program runs one model over every cell; each run of cells runs its own."""
        return False

    def model_at(self, index: int) -> AccumulationModel:
        """The model of index `index` on this axis."""
        return self.models[min(index, len(self.models) - 1)]

    def runs(self) -> list[tuple[int, AccumulationModel, int]]:
        """(first index, model, count) for each run of neighbouring indices with one model."""
        runs: list[tuple[int, AccumulationModel, int]] = []
        for j, model in enumerate(self.models):
            if runs and runs[-1][1] == model:
                runs[-1] = (runs[-1][0], model, runs[-1][2] + 1)
            else:
                runs.append((j, model, 1))
        return runs

    def to_spec(self) -> str:
        runs = ', '.join(m.to_spec() + (f' * {n}' if n > 1 else '') for _, m, n in self.runs())
        return f"{self.kind}({runs}{self._order()})"

    @property
    def name(self) -> str:
        return self.to_spec()

    def _describe_kind(self) -> str:
        runs = self.runs()

        def indices(i: int, first: int, count: int) -> str:
            if i == len(runs) - 1:
                return f"{self.axis}s {first}+"
            return f"{self.axis} {first}" if count == 1 else f"{self.axis}s {first}-{first + count - 1}"

        return f"by {self.axis}: " + "; ".join(f"{indices(i, j, n)} as [{m.describe()}]"
                                               for i, (j, m, n) in enumerate(runs))

    def check_inputs(self, x: np.ndarray, fp16_dtype: bool, argument: str) -> None:
        for model in self.models:
            model.check_inputs(x, fp16_dtype, argument)

    def check_dot(self) -> None:
        raise InvalidArgument(f"{self.to_spec()} differs by {self.axis}: it computes conv2d and its "
                              f"gradients, not dot products")

    def reduce_rows(self, a, b, c):
        self.check_dot()


class Columns(_ByIndex):
    """Output channel j (the GEMM's column) reduced by ``models[min(j, n - 1)]``."""

    kind: ClassVar[str] = "columns"
    axis: ClassVar[str] = "output channel"

    def column_model(self, column: int) -> AccumulationModel:
        """The model of output channel `column`."""
        return self.model_at(column)

    def gemm_into(self, a, w, out, col0, inputs_fp16):
        columns: dict[AccumulationModel, list[int]] = {}
        for j in range(w.shape[1]):  # the columns of each model, wherever they are: one GEMM each
            columns.setdefault(self.column_model(col0 + j), []).append(j)
        for model, picked in columns.items():
            index = np.asarray(picked)
            out[:, col0 + index] = _inner_gemm(model, a, np.ascontiguousarray(w[:, index]), inputs_fp16)


class Rows(_ByIndex):
    """GEMM row r reduced by ``models[min(r, n - 1)]``, each a plain model or a `Columns`: a
    GEMM whose micro kernel is picked by (row block, column block). The rows are the
    outputs' positions: forward (n, oh, ow), input gradient dx's (n, h, w), filter gradient
    the tap (i, j, c)."""

    kind: ClassVar[str] = "rows"
    axis: ClassVar[str] = "GEMM row"

    def _check_model(self, model: AccumulationModel) -> None:
        if isinstance(model, Rows):
            raise InvalidArgument(f"a rows model must be a plain or a columns model, not a rows model; received "
                                  f"{model.to_spec()}")
        if model.positions != Positions.NHW:
            raise InvalidArgument(f"a rows model's models and columns cannot set positions (the order of the whole sum, "
                                  f"the outermost model's); received {model.to_spec()}")
        if model.zeros != Zeros.SIGNED:
            raise InvalidArgument(f"a rows model's models and columns cannot set zeros (the sign of the whole sum's zero "
                                  f"result, the outermost model's); received {model.to_spec()}")
        for inner in model.models if isinstance(model, Columns) else (model,):
            _check_inner(inner, "a rows model")

    def gemm_into(self, a, w, out, col0, inputs_fp16):
        m, n, runs = a.shape[0], w.shape[1], self.runs()
        for i, (r0, model, count) in enumerate(runs):
            r1 = m if i == len(runs) - 1 else min(r0 + count, m)
            if r0 >= m:
                break
            dtype = model.carrier(inputs_fp16)
            part = np.empty((r1 - r0, col0 + n), dtype)  # full width: a columns model picks by channel
            model.gemm_into(convert(a[r0:r1], dtype), convert(w, dtype), part, col0, inputs_fp16)
            out[r0:r1, col0:col0 + n] = convert(part[:, col0:], out.dtype)


COMPOSITE_KINDS: dict[str, type[_Composite]] = {"splitk": SplitK, "lanes": Lanes, "reverse": Reverse,
                                                "columns": Columns, "rows": Rows}


def split_arguments(text: str, separator: str = ",", keep_empty: bool = False) -> list[str]:
    """Top-level `separator`-separated arguments of a call (nested parentheses kept whole),
    stripped; empty ones dropped unless `keep_empty`."""
    depth, start, out = 0, 0, []
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise InvalidArgument(f"unbalanced parentheses in model spec {text!r}")
        elif ch == separator and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise InvalidArgument(f"unbalanced parentheses in model spec {text!r}")
    out.append(text[start:].strip())
    return out if keep_empty else [a for a in out if a]


def parse_composite(spec: str, parse_model) -> AccumulationModel:
    """``KIND(POSITIONAL, ..., KEY=VALUE, ...)`` for KIND in splitk, lanes, reverse, columns, rows."""
    head, _, rest = spec.partition("(")
    kind = head.strip().lower()
    if kind not in COMPOSITE_KINDS:
        raise invalid_choice("composite model", head.strip(), list(COMPOSITE_KINDS))
    if not rest.rstrip().endswith(")"):
        raise InvalidArgument(f"{kind} spec must end with ')'; received {spec!r}")
    args = split_arguments(rest.rstrip()[:-1])
    positional: list[str] = []
    keywords: dict[str, str] = {}
    for a in args:
        key, sep, value = a.partition("=")
        if sep and not any(ch in key for ch in ":("):  # KEY=VALUE, not an inner spec's own keys
            set_once(keywords, key.strip().lower(), value.strip(), f"{kind} spec {spec!r}")
        else:
            positional.append(a)
    usage = {"splitk": "splitk(PARTS | length=N, INNER[, first=MODEL | MODEL ...], combine=FORMAT | MODEL"
                       "[, output=FORMAT]",
             "lanes": "lanes(WIDTH, INNER, combine=MODEL[, tail=N][, output=FORMAT]",
             "reverse": "reverse(INNER[, output=FORMAT]",
             "columns": "columns(MODEL[ * N], MODEL[ * N], ...",
             "rows": "rows(MODEL[ * N], MODEL[ * N], ..."}[kind] + "[, positions=nhw|hwn][, zeros=signed|positive])"
    allowed = {"splitk": {"length", "combine", "output", "inner", "parts", "first"},
               "lanes": {"combine", "output", "inner", "width", "tail"},
               "reverse": {"output", "inner"},
               "columns": {"output"}, "rows": {"output"}}[kind] | {"positions", "zeros"}
    unknown = sorted(set(keywords) - allowed)
    if unknown:
        raise invalid_choice(f"{kind} parameter", unknown[0], sorted(allowed))

    def integer(name: str, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise InvalidArgument(f"{name} must be an integer; received {text!r}") from None

    if kind in ("columns", "rows"):
        if not positional:
            raise InvalidArgument(f"{kind} needs at least one model: {usage}; received {spec!r}")
        models = []
        for text in positional:  # MODEL or MODEL * N: N in a row
            head_text, star, count = text.rpartition("*")
            if star and ")" not in count and ":" not in count:
                if not count.strip().isdecimal() or not count.strip().isascii() or int(count) < 1:
                    raise InvalidArgument(f"a {kind} repeat count must be a positive integer; received {text!r}")
                models += [parse_model(head_text.strip())] * int(count)
            else:
                models.append(parse_model(text))
        by_index: type[_ByIndex] = Columns if kind == "columns" else Rows
        return by_index(models=tuple(models), output=keywords.get("output"), **_whole_sum(keywords))
    values: dict[str, Any] = {}
    size_name = "parts" if kind == "splitk" else "width"
    if kind != "reverse" and positional and positional[0].strip().lstrip("-").isdigit():
        values[size_name] = integer(size_name, positional.pop(0))
    if positional:
        values["inner"] = positional.pop(0)
    if positional:
        raise InvalidArgument(f"{kind} takes {usage}; received {spec!r}")
    for key in ("parts", "width", "length", "tail"):
        if key in keywords:
            values[key] = integer(key, keywords.pop(key))
    values.update(keywords)
    if "inner" not in values:
        raise InvalidArgument(f"{kind} needs an inner model: {usage}; received {spec!r}")
    inner = parse_model(values.pop("inner"))
    if kind == "reverse":
        return Reverse(inner=inner, output=values.pop("output", None), **_whole_sum(values))
    if kind == "splitk":
        if "first" in values:
            text = values.pop("first")
            models = split_arguments(text, "|", keep_empty=True)
            if not all(models):
                raise InvalidArgument(f"splitk's first must be models separated by |; received first={text!r}")
            values["first"] = tuple(parse_model(m) for m in models)
        text = values.pop("combine", "fp32")
        try:
            combine = resolve_format(text, "combine")
        except InvalidArgument:  # not a format: a model reduces the partial results
            return SplitK(inner=inner, combine=parse_model(text), output=values.pop("output", None), **values)
        return SplitK(combine, inner=inner, output=values.pop("output", None), **values)
    if "combine" not in values:
        raise InvalidArgument(f"lanes needs combine=MODEL: {usage}; received {spec!r}")
    combine = parse_model(values.pop("combine"))
    return Lanes(width=values.pop("width", 4), inner=inner, combine=combine, tail=values.pop("tail", 0),
                 output=values.pop("output", None), **_whole_sum(values))


def _whole_sum(keywords: dict[str, Any]) -> dict[str, Any]:
    """The options of the whole sum a spec gave (positions, zeros), removed from `keywords`."""
    return {key: keywords.pop(key) for key in ("positions", "zeros") if key in keywords}


def lanes_shorthand(spec: str, parse_model) -> Lanes:
    """identify's lane family: ``lanes:FMT:w=W[:then=sequential|pairwise][:product=FMT]`` =
    ``lanes(W, sequential:FMT:product=P, combine=THEN:FMT[:output=fp16])``."""
    parts = spec.strip().split(":")
    if len(parts) < 3:
        raise InvalidArgument(f"lane model must look like 'lanes:fp16:w=16:then=pairwise'; "
                              f"received {spec!r}")
    fmt = parts[1]
    options: dict[str, str] = {}
    for part in parts[2:]:
        key, _, value = part.partition("=")
        set_once(options, key, value, f"lane model {spec!r}")
    unknown = sorted(set(options) - {"w", "then", "product"})
    if unknown:
        raise invalid_choice("lane model parameter", unknown[0], ("w", "then", "product"))
    try:
        width = int(options.get("w", ""))
    except ValueError:
        raise InvalidArgument(f"lane model w must be a positive integer; received {spec!r}") from None
    then = options.get("then", "sequential")
    if then not in ("sequential", "pairwise"):
        raise invalid_choice("lane model then", then, ("sequential", "pairwise"))
    product = options.get("product", "exact")
    out = "" if resolve_format(fmt, "lane format").name == "fp16" else ":output=fp16"
    return Lanes(width=width, inner=parse_model(f"sequential:{fmt}:product={product}"),
                 combine=parse_model(f"{then}:{fmt}{out}"))
