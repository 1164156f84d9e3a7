"""Accumulation models: small named, frozen objects that say how a sum of products is formed.

One file, over 600 lines: the plain models share one frame and one spec round trip
(issue 60 moves the spec grammar into its own module).

Every model reduces ``sum_k a_k * b_k`` in the order given. Common parameters:

* ``accumulator`` - format the running value is rounded to after each step.
* ``product`` - ``"exact"`` (a fused multiply-add chain) or a format each product
  is rounded to (nearest-even) before it is added.
* ``addition`` - ``"exact"`` or a format each addition is computed in
  (nearest-even) before it is rounded to the accumulator: CPU half arithmetic
  converts to float, adds and rounds back, i.e. two roundings.
* ``output`` - format of the result (default: the accumulator).
* ``rounding`` - mode of every accumulator, total and output rounding;
  ``subnormals``, ``overflow`` - see `convprobe.emulation.rounding`.
* ``seed`` - stochastic rounding key (counter-based: same seed, same bits).
* ``rbits`` - random bits per stochastic rounding (default: `convprobe.random_stream`'s R,
  13 for fp16; at most min(32, 51 - p) over the stochastically rounded formats).
* ``order`` - for convolutions, the nesting of the reduction over K, outermost
  first, as a permutation of ``"hwc"`` (kernel row, kernel column, input channel);
  the default ``"hwc"`` is HWIO filter order.
* ``positions`` - a filter gradient's order over the batch positions: ``"nhw"`` (the
  default, image by image) or ``"hwn"`` (the batch innermost; `options.Positions`).
* ``zeros`` - the sign of a zero result: ``"signed"`` (the default, as IEEE 754 rounds it)
  or ``"positive"`` (+0 always: the sum lands on a +0-initialised output; `options.Zeros`).
  Like ``positions`` it belongs to the whole sum, so only the outermost model sets it.

Sequential and chunked sums start from +0. Spec strings: see `convprobe.emulation.specs`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import KW_ONLY, dataclass, field, fields
from itertools import permutations
from typing import Any, ClassVar

import numpy as np

from convprobe.emulation import _kernels as K
from convprobe.emulation import plan
from convprobe.emulation.gpus import GPU_PRESETS, preset_spec, tensor_core_parameters
from convprobe.emulation.rounding import (
    MODE_CODES,
    OVERFLOWS,
    ROUNDINGS,
    SUBNORMALS,
    _ROUNDING_ALIASES,
    check_choice,
    format_row,
    resolve_format,
    check_rbits,
    stochastic_bits,
)
from convprobe.random_stream import max_bits
from convprobe.errors import InvalidArgument, invalid_choice, is_integer, set_once
from convprobe.formats import FP16, FP32, FP64, Format, custom_format
from convprobe.options import Alignment, CAddition, KLayout, Positions, Rounding, Zeros, parse_option

__all__ = [
    "AccumulationModel",
    "Sequential",
    "Pairwise",
    "Blocked",
    "Chunked",
    "Exact",
    "MODEL_KINDS",
    "TENSOR_CORE_PRESETS",
    "ORDERS",
    "parse_plain",
    "kernel_config",
]

ORDERS: tuple[str, ...] = tuple("".join(p) for p in permutations("hwc"))
_EXACT = "exact"


def _is_fp64(fmt: Format) -> bool:
    return fmt.precision == 53 and fmt.emin == -1022


def as_format(value: Format | str | None) -> Format:
    """A model's format field as read after construction: the fields' types say what the
    constructor accepts (a name, None for a default), and `__post_init__` resolves
    accumulator, output, input, adder and total to Formats."""
    assert isinstance(value, Format), value
    return value


@dataclass(frozen=True)
class AccumulationModel:
    """Base of all models; use a subclass."""

    accumulator: Format | str = FP16
    _: KW_ONLY
    product: Format | str = _EXACT
    addition: Format | str = _EXACT
    output: Format | str | None = None
    rounding: str = "nearest_even"
    subnormals: str = "keep"
    overflow: str = "inf"
    seed: int = 0
    rbits: int | None = None
    order: str = "hwc"
    positions: Positions | str = Positions.NHW
    zeros: Zeros | str = Zeros.SIGNED

    kind: ClassVar[str] = "model"
    _kind_code: ClassVar[int] = -1

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        if type(self) is AccumulationModel:
            raise InvalidArgument("AccumulationModel is abstract; use Sequential, Pairwise, "
                                  "Blocked, Chunked or Exact")
        acc = resolve_format(self.accumulator, "accumulator")
        self._set("accumulator", acc)
        for name in ("product", "addition"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().lower() == _EXACT:
                self._set(name, _EXACT)
            else:
                self._set(name, resolve_format(value, name))
        self._set("output", acc if self.output is None else resolve_format(self.output, "output"))
        self._set("rounding", check_choice("rounding", self.rounding, ROUNDINGS, _ROUNDING_ALIASES))
        self._set("subnormals", check_choice("subnormals", self.subnormals, SUBNORMALS))
        self._set("overflow", check_choice("overflow", self.overflow, OVERFLOWS))
        self._set("order", check_choice("order", self.order, ORDERS))
        self._set("positions", parse_option("positions", self.positions, Positions))
        self._set("zeros", parse_option("zeros", self.zeros, Zeros))
        if not is_integer(self.seed) or not (
            0 <= int(self.seed) < 2**64
        ):
            raise InvalidArgument(f"seed must be an integer in [0, 2**64); received {self.seed!r}")
        self._set("seed", int(self.seed))
        for fmt, argument in self._summed_formats():
            if fmt.precision > 51 and not _is_fp64(fmt):
                raise InvalidArgument(
                    f"{argument} precision must be at most 51 bits (or exactly fp64); "
                    f"received {fmt.name} with {fmt.precision}"
                )
        self._validate()
        if self.rounding == "stochastic":
            for fmt, argument in self._stochastic_formats():
                if fmt.precision > 50:
                    raise InvalidArgument(
                        f"stochastic rounding needs {argument} precision of at most 50 bits; "
                        f"received {fmt.name}"
                    )
        self._check_rbits()

    def _check_rbits(self) -> None:
        """rbits, where set, must suit every stochastically rounded format; the default
        spelt out is the default (None), so equal models have equal specs."""
        if self.rbits is not None:
            for fmt, argument in self._stochastic_formats():
                self._set("rbits", check_rbits(self.rbits, fmt, self.rounding, f"the {argument} format "))
            if self.rbits == self._default_rbits():
                self._set("rbits", None)

    def _default_rbits(self) -> int:
        """The most random bits any stochastically rounded format takes by default, capped
        at the fewest any allows (`convprobe.random_stream`)."""
        formats = [fmt for fmt, _ in self._stochastic_formats()]
        return min(max(stochastic_bits(f) for f in formats), min(max_bits(f.precision) for f in formats))

    # -- hooks -------------------------------------------------------------
    def _validate(self) -> None:
        """Subclass-specific parameter checks."""

    def _summed_formats(self) -> list[tuple[Format, str]]:
        """Formats that receive an exactly formed sum (round-to-odd needs p <= 51)."""
        out = [(as_format(self.accumulator), "accumulator")]
        if isinstance(self.addition, Format):  # (else "exact")
            out.append((self.addition, "addition"))
        return out

    def _stochastic_formats(self) -> list[tuple[Format, str]]:
        return [(as_format(self.accumulator), "accumulator"), (as_format(self.output), "output")]

    def _extra_params(self) -> dict[str, Any]:
        return {}

    @property
    def random_bits(self) -> int:
        """R, the random bits each stochastic rounding draws: `rbits` if set, else
        `_default_rbits`; 1 without stochastic rounding."""
        if self.rounding != "stochastic":
            return 1
        return self._default_rbits() if self.rbits is None else self.rbits

    # -- public ------------------------------------------------------------
    @property
    def name(self) -> str:
        """Short label, e.g. ``sequential:fp16`` or ``blocked:fp32:b=8``."""
        extra = "".join(f":{k}={v}" for k, v in self._extra_params().items())
        return f"{self.kind}:{as_format(self.accumulator).name}{extra}"

    @property
    def output_dtype(self) -> np.dtype:
        """Storage dtype of results: the output format's, float64 for custom formats."""
        output = as_format(self.output)
        if output.dtype_name is None:
            return np.dtype(np.float64)
        return output.dtype

    def to_spec(self) -> str:
        """A `parse_model` spec that rebuilds this model exactly."""
        parts = [self.name]
        defaults = {f.name: f.default for f in fields(self)}
        for key in ("product", "addition", "output", "rounding", "subnormals", "overflow",
                    "seed", "rbits", "order", "positions", "zeros"):
            value = getattr(self, key)
            default = defaults[key]
            if key == "output":
                default = self.accumulator
            if value != default:
                parts.append(f"{key}={value.name if isinstance(value, Format) else value}")
        return ":".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able description (formats by name)."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "spec": self.to_spec()}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.name if isinstance(value, Format) else value
        return out

    def describe(self) -> str:
        """One sentence saying what arithmetic this model performs."""
        prod = "exact products" if self.product == _EXACT else f"products rounded to {self.product}"
        add = ("" if self.addition == _EXACT
               else f", each addition computed in {self.addition} then rounded")
        text = (f"{self._describe_kind()}; {prod}{add}; {self.rounding.replace('_', ' ')} "
                f"rounding, subnormals {self.subnormals}, overflow to {self.overflow}; "
                f"output {self.output}")
        if self.rounding == "stochastic":
            text += f"; seed {self.seed}, {self.random_bits} random bits per rounding"
        if self.positions == Positions.HWN:
            text += "; a filter gradient sums its positions (oh, ow, n), the batch innermost"
        if self.zeros == Zeros.POSITIVE:
            text += "; a zero result is +0 (the sum lands on a +0-initialised output)"
        return text

    def _describe_kind(self) -> str:
        raise NotImplementedError

    # -- arithmetic (the compiled kernels; composite and block-FMA models override) --
    def dot_rows(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
        """`reduce_rows` as `dot` runs it: the same values, by a faster kernel where a model
        has one (the block-FMA models: their reference `reduce_rows` runs in NumPy)."""
        return self.reduce_rows(a, b, c)

    def dot_carrier(self, inputs_fp16: bool) -> type:
        """The dtype `dot_rows` takes without c: float64, the reference's."""
        return np.float64

    def reduce_rows(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
        """out[r] = the modelled reduction of a[r, :] * b[r, :] (float64 (R, K) operands)."""
        if c is not None:
            raise InvalidArgument(f"c (an accumulator input, D = A.B + C) needs a block-FMA "
                                  f"model such as a100 or blocked:fp32:b=8; received "
                                  f"{self.to_spec()}")
        fp, ic, seed = kernel_config(self)
        out = np.empty(a.shape[0], dtype=np.float64)
        K.reduce_pairs(a, b, fp, ic, np.uint64(seed), out)
        return out

    def check_dot(self) -> None:
        """Raise where this model has no dot product: one that picks its arithmetic by an
        output's place in a convolution (`columns`, `rows`)."""

    def check_inputs(self, x: np.ndarray, fp16_dtype: bool, argument: str) -> None:
        """Raise unless every value of x (float64, or the float16 or float32 carrier of fp16
        values: `fp16_dtype`, it came from an fp16 or narrower dtype) is a valid input; only
        block-FMA models have an input format. Convolutions call it once per operand, before
        im2col multiplies the values."""

    def gemm_into(self, a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int,
                  inputs_fp16: bool) -> None:
        """out[:, col0:col0 + N] = the modelled reductions of a (M, K) against w (K, N), in
        the dtype `carrier` names."""
        fp, ic, seed = kernel_config(self)
        if a.dtype == np.float32 and not K.fp32_carriers(fp, ic, True):
            plan.run(self.program(a.shape[1]), a, w, out, col0)
        else:
            K.gemm(a, w, fp, ic, seed, out, col0, inputs_fp16)

    def carrier(self, inputs_fp16: bool) -> type:
        """The dtype `gemm_into` takes for a, w and out: float16 where the CPU's own fp16
        arithmetic computes this model (`_kernels.native_fp16`), float32 where its float32
        FMA or the exact kernel does (`fp32_carriers`) or, on fp16 inputs, the model's
        program (`plan`); float16 where the direct kernels on fp16 bit patterns compute
        it (`fp16_carriers`), else float64."""
        fp, ic, _ = kernel_config(self)
        if K.native_fp16(fp, ic, inputs_fp16):
            return np.float16
        if K.fp32_carriers(fp, ic, inputs_fp16) or (inputs_fp16 and self.plannable()):
            return np.float32
        return np.float16 if K.fp16_carriers(fp, ic, inputs_fp16) else np.float64

    def plannable(self) -> bool:
        """Whether this model compiles into a kernel program (`plan`)."""
        if not plan.plannable(self):
            return False
        try:
            self.program(self._plan_probe_k())
        except plan.NotPlannable:
            return False
        return True

    def _plan_probe_k(self) -> int:
        """A reduction length to try compiling at (a tree's own K)."""
        return 2

    def program(self, k: int) -> plan.Program:
        """This model's sums of k products as a kernel program (`plan`)."""
        return _program(self, k)

    def emit(self, steps: plan.ProgramBuilder, items: list[plan.Item], register: int) -> None:
        """Write the steps that leave this model's sum of `items` in `register` (registers
        above it are scratch); see `plan`."""
        raise plan.NotPlannable(f"{self.kind} models have no kernel program")

    def sum_terms(self, terms: np.ndarray) -> np.ndarray:
        """out[r] = the modelled sum of terms[0, r], terms[1, r], ... (float64 (P, R)), as
        products with 1: how composites reduce their partial results."""
        fp, ic, seed = kernel_config(self)
        out = np.empty(terms.shape[1])
        K.sum_terms(np.ascontiguousarray(terms, np.float64), fp, ic, np.uint64(seed), out)
        return out


@dataclass(frozen=True)
class Sequential(AccumulationModel):
    """Left-to-right recursive summation: s <- round(s + p_k), s_0 = +0."""

    kind: ClassVar[str] = "sequential"
    _kind_code: ClassVar[int] = K.SEQUENTIAL

    def _describe_kind(self) -> str:
        return f"sequential sum in {self.accumulator} from +0"

    def emit(self, steps, items, register):
        steps.zero(register)
        for item in items:
            steps.add(self, register, item)
        steps.round(self, register, self.output)


@dataclass(frozen=True)
class Pairwise(AccumulationModel):
    """Tree summation: level by level, neighbours (2j, 2j+1) added and rounded; an odd last
    element moves up unchanged (Higham, "Accuracy and Stability of Numerical
    Algorithms", 2nd ed., sec. 4.2)."""

    kind: ClassVar[str] = "pairwise"
    _kind_code: ClassVar[int] = K.PAIRWISE

    def _describe_kind(self) -> str:
        return f"pairwise (tree) sum in {self.accumulator}"

    def emit(self, steps, items, register):
        """Level by level as a tree, run depth first: a node's left value in register d,
        its right one in d + 1 (registers: the tree's depth)."""
        if not items:
            steps.zero(register)
            return
        level: list = list(items)
        while len(level) > 1:
            level = [(level[j], level[j + 1]) for j in range(0, len(level) - 1, 2)] + (
                [level[-1]] if len(level) % 2 else [])

        def node(item, at: int) -> None:
            if not isinstance(item, tuple):
                steps.take(self, at, item)
                return
            left, right = item
            node(left, at)
            if isinstance(right, tuple):
                node(right, at + 1)
                steps.combine(self, at, at + 1)
            else:
                steps.add(self, at, right)

        node(level[0], register)
        steps.round(self, register, self.output)


@dataclass(frozen=True)
class Blocked(AccumulationModel):
    """Block fused multiply-add, as in tensor cores: D = C + sum_k a_k * b_k, block by block.

    One MMA instruction takes `step` products (default: one block of `b`); within it, in
    `layout` order, each block of `b` exact products and the running value s (the
    accumulator input c, rounded to `accumulator`, for the first block; +0 there when
    `c_addition` is "separate") is

    1. aligned to the largest exponent E: with `alignment` "input_exponents" a product
       counts as e_a + e_b, each exponent clamped at the `input` format's emin (the
       significand product lies in [0, 4)); s counts with its own exponent;
    2. truncated toward zero to a multiple of 2**(E - (p_adder - 1) - extra_bits), p_adder
       the precision of the `adder` format (default: the accumulator), unless `truncate` is
       false (then nothing is lost while aligning); zero products take no part, and a
       block of zero products leaves s as it is;
    3. summed exactly, and the sum rounded (`rounding`) to `accumulator`, narrowed to
       p_adder + extra_bits bits when extra_bits < 0 (e.g. fp8 on Ada and H100: 13
       fraction bits). That value is the next block's s.

    With `c_addition` "separate", c is added to each instruction's result at its end, in
    one nearest-even rounding to `accumulator`. The result is converted to `output` with
    nearest-even, as a GPU kernel's epilogue (cvt.rn) converts an fp32 accumulator. Products are exact unless `product` is a
    format; `addition` must stay exact. Published parameters: `convprobe.emulation.gpus`.
    """

    b: int = 4
    extra_bits: int = 0
    rounding: str = field(default="toward_zero", kw_only=True)
    input: Format | str = field(default=FP16, kw_only=True)
    adder: Format | str | None = field(default=None, kw_only=True)
    alignment: str = field(default=Alignment.INPUT_EXPONENTS, kw_only=True)
    truncate: bool = field(default=True, kw_only=True)
    step: int | None = field(default=None, kw_only=True)
    layout: str = field(default=KLayout.CONTIGUOUS, kw_only=True)
    c_addition: str = field(default=CAddition.FUSED, kw_only=True)
    preset: str | None = field(default=None, kw_only=True, compare=False)

    kind: ClassVar[str] = "blocked"

    def _validate(self) -> None:
        self._set("b", _int_at_least("b", self.b, 1))
        if not is_integer(self.extra_bits):
            raise InvalidArgument(f"extra_bits must be an integer; received {self.extra_bits!r}")
        self._set("extra_bits", int(self.extra_bits))
        self._set("input", resolve_format(self.input, "input"))
        self._set("adder", self.accumulator if self.adder is None
                  else resolve_format(self.adder, "adder"))
        self._set("alignment", parse_option("alignment", self.alignment, Alignment))
        self._set("layout", parse_option("layout", self.layout, KLayout))
        self._set("c_addition", parse_option("c_addition", self.c_addition, CAddition))
        if not isinstance(self.truncate, (bool, np.bool_)):
            raise InvalidArgument(f"truncate must be true or false; received {self.truncate!r}")
        self._set("truncate", bool(self.truncate))
        step = self.b if self.step is None else _int_at_least("step", self.step, 1)
        if step % self.b:
            raise InvalidArgument(f"step must be a multiple of b ({self.b}); received {step}")
        self._set("step", step)
        if self.layout == KLayout.PAIR_INTERLEAVED and step % 4:
            raise InvalidArgument(f"layout pair_interleaved needs step to be a multiple of 4; "
                                  f"received {step}")
        if self.rounding == Rounding.STOCHASTIC:
            raise InvalidArgument("rounding of a blocked model must be one of nearest_even, "
                                  "toward_zero; received 'stochastic'")
        if isinstance(self.addition, Format):  # (else "exact")
            raise InvalidArgument(f"addition of a blocked model must be exact (the block adder "
                                  f"sums exactly); received {self.addition.name}")
        adder = as_format(self.adder)
        narrowed = adder.precision + min(self.extra_bits, 0)
        if narrowed < 2:
            raise InvalidArgument(f"extra_bits must be at least {2 - adder.precision} for "
                                  f"adder {adder.name}; received {self.extra_bits}")
        width = adder.precision + self.extra_bits + 1 + math.ceil(math.log2(self.b + 1))
        if width > 53:
            raise InvalidArgument(
                f"b and extra_bits must satisfy p_adder + extra_bits + 1 + ceil(log2(b + 1)) <= "
                f"53 (exact float64 block sums); received b={self.b}, extra_bits="
                f"{self.extra_bits} with adder {self.adder}"
            )

    @property
    def block_format(self) -> Format:
        """The format each block's sum is rounded to: the accumulator, narrowed when
        extra_bits < 0."""
        accumulator = as_format(self.accumulator)
        p = accumulator.precision
        if self.extra_bits < 0:
            p = min(p, as_format(self.adder).precision + self.extra_bits)
        if p == accumulator.precision:
            return accumulator
        return custom_format(p, accumulator.emax, subnormals=accumulator.subnormals,
                             has_inf=accumulator.has_inf,
                             name=f"{accumulator.name}_p{p}")

    def _extra_params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"b": self.b}
        if self.extra_bits:
            out["extra"] = self.extra_bits
        return out

    def to_spec(self) -> str:
        """The GPU preset's spec where the model came from one (``a100``,
        ``v100:out=fp16``), else the explicit ``blocked:...`` spec."""
        if self.preset is not None and parse_plain(self.preset) == self:
            return self.preset
        return self.explicit_spec()

    def explicit_spec(self) -> str:
        """The ``blocked:...`` spec that rebuilds this model, even where it is a preset."""
        spec = super().to_spec()
        parts = []
        defaults = {"input": FP16, "adder": self.accumulator,
                    "alignment": Alignment.INPUT_EXPONENTS, "truncate": True, "step": self.b,
                    "layout": KLayout.CONTIGUOUS, "c_addition": CAddition.FUSED}
        for key, default in defaults.items():
            value = getattr(self, key)
            if value != default:
                text = value.name if isinstance(value, Format) else str(value).lower()
                parts.append(f"{key}={text}")
        return ":".join([spec, *parts])

    def _describe_kind(self) -> str:
        text = (f"block FMA of {self.b} products plus the {self.accumulator} accumulator "
                f"({self.input} inputs), aligned to the largest "
                f"{'e_a + e_b' if self.alignment == Alignment.INPUT_EXPONENTS else 'exponent'}"
                f" with {self.extra_bits} extra bits beyond {self.adder}"
                f"{' and truncated' if self.truncate else ' exactly'}")
        if self.step != self.b or self.layout != KLayout.CONTIGUOUS:
            text += f", {self.step} products per instruction in {self.layout} order"
        if self.c_addition == CAddition.SEPARATE:
            text += ", c added after each instruction (nearest even)"
        return text

    # the block adder runs in NumPy, vectorised across outputs (`_block_fma`)
    def reduce_rows(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
        from convprobe.emulation import _block_fma

        return _block_fma.reduce_rows(a, b, c, self)

    def dot_rows(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
        """Without c, the compiled 32-bit kernel where it applies (`_block_fma.dot_rows`)."""
        from convprobe.emulation import _block_fma

        return _block_fma.reduce_rows(a, b, c, self) if c is not None else _block_fma.dot_rows(a, b, self)

    def sum_terms(self, terms: np.ndarray) -> np.ndarray:
        return sum_terms_as_rows(self, terms)  # (reduce_rows checks the input format)

    def check_inputs(self, x: np.ndarray, fp16_dtype: bool, argument: str) -> None:
        from convprobe.emulation import _block_fma

        if not (fp16_dtype and as_format(self.input).holds(FP16)):  # fp16 values need no check then
            _block_fma._check_inputs(x, self, argument)

    def carrier(self, inputs_fp16: bool) -> type:
        """float32 where the 32-bit-lane kernel computes this model (an input format of fp16
        or narrower, every format inside float32's: `_block_fma_narrow`), else float64; for
        any input dtype (`check_inputs` has checked the values are the input format's)."""
        from convprobe.emulation import _block_fma_compiled, _block_fma_narrow

        narrow = (_block_fma_compiled.applies(self) and _block_fma_narrow.applies(self)
                  and FP32.holds(as_format(self.output)))
        return np.float32 if narrow else np.float64

    dot_carrier = carrier  # (the 32-bit kernel takes dot's rows too)

    def gemm_into(self, a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int,
                  inputs_fp16: bool) -> None:
        from convprobe.emulation import _block_fma

        out[:, col0:col0 + w.shape[1]] = _block_fma.gemm(a, w, self, inputs_checked=True)


@functools.lru_cache(maxsize=256)
def _program(model: AccumulationModel, k: int) -> plan.Program:
    return plan.compile_model(model, k)


def sum_terms_as_rows(model: AccumulationModel, terms: np.ndarray) -> np.ndarray:
    """`sum_terms` by the model's own `reduce_rows` (models without scalar kernels)."""
    return model.reduce_rows(terms.T, np.ones_like(terms.T), None)


def _int_at_least(name: str, value: object, low: int) -> int:
    if not is_integer(value) or value < low:
        raise InvalidArgument(f"{name} must be an integer >= {low}; received {value!r}")
    return int(value)


@dataclass(frozen=True)
class Chunked(AccumulationModel):
    """Chunked promotion: N terms summed sequentially in the accumulator (from +0),
    each chunk total then added to a running `total` in a wider format
    (Blanchard, Higham, Lopez, Mary & Pranesh, "Mixed precision block fused
    multiply-add", SIAM J. Sci. Comput. 42(3), 2020, sec. 2)."""

    chunk: int = 32
    total: Format | str = field(default=FP32)

    kind: ClassVar[str] = "chunked"
    _kind_code: ClassVar[int] = K.CHUNKED

    def _validate(self) -> None:
        value = self.chunk
        if not is_integer(value) or value < 1:
            raise InvalidArgument(f"chunk must be an integer >= 1; received {value!r}")
        self._set("chunk", int(value))
        total = resolve_format(self.total, "total")
        if total.precision > 51 and not _is_fp64(total):
            raise InvalidArgument(f"total precision must be at most 51 bits (or exactly fp64); "
                                  f"received {total.name}")
        self._set("total", total)

    def _stochastic_formats(self) -> list[tuple[Format, str]]:
        return [*super()._stochastic_formats(), (as_format(self.total), "total")]

    def _extra_params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.chunk}
        if self.total != FP32:
            out["total"] = as_format(self.total).name
        return out

    def _describe_kind(self) -> str:
        return (f"chunks of {self.chunk} terms summed in {self.accumulator}, each chunk "
                f"added to a {self.total} total")

    def emit(self, steps, items, register):
        steps.zero(register)
        for start in range(0, len(items), self.chunk):
            steps.zero(register + 1)
            for item in items[start:start + self.chunk]:
                steps.add(self, register + 1, item)
            steps.combine(self, register, register + 1, self.total, addition=False)
        steps.round(self, register, self.output)


@dataclass(frozen=True)
class Exact(AccumulationModel):
    """The exact sum of the products, rounded once to `accumulator` (then to `output`)."""

    accumulator: Format | str = FP64

    kind: ClassVar[str] = "exact"
    _kind_code: ClassVar[int] = K.EXACT

    def _summed_formats(self) -> list[tuple[Format, str]]:
        return []

    def _describe_kind(self) -> str:
        return f"exact sum (long accumulator) rounded once to {self.accumulator}"


MODEL_KINDS: dict[str, type[AccumulationModel]] = {
    cls.kind: cls for cls in (Sequential, Pairwise, Blocked, Chunked, Exact)
}

TENSOR_CORE_PRESETS = GPU_PRESETS

_KEY_ALIASES = {"extra": "extra_bits", "n": "chunk", "acc": "accumulator", "out": "output",
                "in": "input"}
_INT_KEYS = {"b", "extra_bits", "chunk", "seed", "rbits", "step"}
_BOOL_KEYS = {"truncate"}


def parse_plain(spec: str) -> AccumulationModel:
    """A model of the grammar's first two forms (``KIND[:ACCUMULATOR][:KEY=VALUE]...`` and
    ``GPU[:in=FORMAT][:out=FORMAT]...``); `convprobe.emulation.specs.parse_model` reads
    every form and hands these here."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument(f"model spec must be a non-empty string like 'sequential:fp16'; "
                              f"received {spec!r}")
    parts = [p.strip() for p in spec.strip().split(":")]
    kind = parts[0].lower()
    kwargs: dict[str, Any] = {}
    given: dict[str, Any] = {}  # what the spec itself says, each key once
    rest = parts[1:]
    if kind in TENSOR_CORE_PRESETS:
        cls: type[AccumulationModel] = Blocked
        formats: dict[str, str] = {}
        for item in list(rest):
            key, _, value = item.partition("=")
            key = _KEY_ALIASES.get(key.strip().lower(), key.strip().lower())
            if key in ("input", "output"):
                set_once(formats, key, value, f"{kind} spec {spec!r}")
                rest.remove(item)
        kwargs.update(tensor_core_parameters(kind, formats.get("input", "fp16"), formats.get("output", "fp32")))
        if not rest:
            kwargs["preset"] = preset_spec(kind, kwargs["input"], kwargs["output"])
    elif kind in MODEL_KINDS:
        cls = MODEL_KINDS[kind]
        if rest and "=" not in rest[0]:
            given["accumulator"] = rest.pop(0)
    else:
        raise invalid_choice("model", parts[0], (*MODEL_KINDS, *TENSOR_CORE_PRESETS))
    allowed = {f.name for f in fields(cls) if f.name != "_"}
    for item in rest:
        key, sep, value = item.partition("=")
        key = _KEY_ALIASES.get(key.strip().lower(), key.strip().lower())
        if not sep or key not in allowed:
            valid = sorted(allowed | {k for k, v in _KEY_ALIASES.items() if v in allowed})
            raise invalid_choice(f"{kind} model parameter", item, valid)
        if key in _INT_KEYS:
            try:
                number = int(value)
            except ValueError:
                raise InvalidArgument(f"{key} must be an integer; received {value!r}") from None
            set_once(given, key, number, f"{kind} spec {spec!r}")
        elif key in _BOOL_KEYS:
            flag = value.strip().lower()
            if flag not in ("true", "false"):
                raise invalid_choice(key, value, ("true", "false"))
            set_once(given, key, flag == "true", f"{kind} spec {spec!r}")
        else:
            set_once(given, key, value, f"{kind} spec {spec!r}")
    return cls(**{**kwargs, **given})  # what the spec gives beside a preset refines it


def kernel_config(model: AccumulationModel) -> tuple[np.ndarray, np.ndarray, int]:
    """The (fp, ic, seed) arrays `_kernels.reduce_*` take for this model."""
    if not isinstance(model, AccumulationModel):
        raise InvalidArgument(f"model must be an AccumulationModel (e.g. Sequential('fp16')); "
                              f"received {model!r}")
    sub = model.subnormals
    fp = np.zeros((5, K.F_SIZE), dtype=np.float64)
    if isinstance(model.product, Format):  # (else "exact": a zero row)
        fp[K.PRODUCT] = format_row(model.product, sub)
    if isinstance(model.addition, Format):
        fp[K.ADDITION] = format_row(model.addition, sub)
    fp[K.ACCUMULATOR] = format_row(as_format(model.accumulator), sub)
    fp[K.OUTPUT] = format_row(as_format(model.output), sub)
    if isinstance(model, Chunked):
        fp[K.TOTAL] = format_row(as_format(model.total), sub)
    ic = np.zeros(K.IC_SIZE, dtype=np.int64)
    ic[K.IC_KIND] = model._kind_code
    ic[K.IC_MODE] = MODE_CODES[model.rounding]
    ic[K.IC_SAT] = int(model.overflow == "saturate")
    ic[K.IC_RBITS] = model.random_bits
    if isinstance(model, Chunked):
        ic[K.IC_CHUNK] = model.chunk
    return fp, ic, model.seed
