"""Accumulation models: small named, frozen objects that say how a sum of products is formed.

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
* ``order`` - for convolutions, the nesting of the reduction over K, outermost
  first, as a permutation of ``"hwc"`` (kernel row, kernel column, input channel);
  the default ``"hwc"`` is HWIO filter order.

Sequential and chunked sums start from +0. Spec strings: see `parse_model`.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field, fields
from itertools import permutations
from typing import Any, ClassVar

import numpy as np

from convprobe.emulation import _kernels as K
from convprobe.emulation.rounding import (
    OVERFLOWS,
    ROUNDINGS,
    SUBNORMALS,
    _ROUNDING_ALIASES,
    check_choice,
    format_row,
    resolve_format,
    stochastic_bits,
)
from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.formats import FP16, FP32, FP64, Format

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
    "parse_model",
    "kernel_config",
]

ORDERS: tuple[str, ...] = tuple("".join(p) for p in permutations("hwc"))
_EXACT = "exact"


def _is_fp64(fmt: Format) -> bool:
    return fmt.precision == 53 and fmt.emin == -1022


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
    order: str = "hwc"

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
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or not (
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

    # -- hooks -------------------------------------------------------------
    def _validate(self) -> None:
        """Subclass-specific parameter checks."""

    def _summed_formats(self) -> list[tuple[Format, str]]:
        """Formats that receive an exactly formed sum (round-to-odd needs p <= 51)."""
        out = [(self.accumulator, "accumulator")]
        if self.addition != _EXACT:
            out.append((self.addition, "addition"))
        return out

    def _stochastic_formats(self) -> list[tuple[Format, str]]:
        return [(self.accumulator, "accumulator"), (self.output, "output")]

    def _extra_params(self) -> dict[str, Any]:
        return {}

    @property
    def random_bits(self) -> int:
        """R, the random bits each stochastic rounding draws: the fewest that any
        stochastically rounded format allows (`rounding.stochastic_bits`); 1 otherwise."""
        if self.rounding != "stochastic":
            return 1
        return min(stochastic_bits(fmt) for fmt, _ in self._stochastic_formats())

    # -- public ------------------------------------------------------------
    @property
    def name(self) -> str:
        """Short label, e.g. ``sequential:fp16`` or ``blocked:fp32:b=8``."""
        extra = "".join(f":{k}={v}" for k, v in self._extra_params().items())
        return f"{self.kind}:{self.accumulator.name}{extra}"

    @property
    def output_dtype(self) -> np.dtype:
        """Storage dtype of results: the output format's, float64 for custom formats."""
        if self.output.dtype_name is None:
            return np.dtype(np.float64)
        return self.output.dtype

    def to_spec(self) -> str:
        """A `parse_model` spec that rebuilds this model exactly."""
        parts = [self.name]
        defaults = {f.name: f.default for f in fields(self)}
        for key in ("product", "addition", "output", "rounding", "subnormals", "overflow",
                    "seed", "order"):
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
            text += f"; seed {self.seed}"
        return text

    def _describe_kind(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Sequential(AccumulationModel):
    """Left-to-right recursive summation: s <- round(s + p_k), s_0 = +0."""

    kind: ClassVar[str] = "sequential"
    _kind_code: ClassVar[int] = K.SEQUENTIAL

    def _describe_kind(self) -> str:
        return f"sequential sum in {self.accumulator} from +0"


@dataclass(frozen=True)
class Pairwise(AccumulationModel):
    """Tree summation: level by level, neighbours (2j, 2j+1) added and rounded; an odd last
    element moves up unchanged (Higham, "Accuracy and Stability of Numerical
    Algorithms", 2nd ed., sec. 4.2)."""

    kind: ClassVar[str] = "pairwise"
    _kind_code: ClassVar[int] = K.PAIRWISE

    def _describe_kind(self) -> str:
        return f"pairwise (tree) sum in {self.accumulator}"


@dataclass(frozen=True)
class Blocked(AccumulationModel):
    """Fused multi-term addition of b products and the accumulator, as in tensor cores.

    Each block: the accumulator and b exact products are aligned to the largest
    exponent E, truncated to multiples of 2**(E - (p_acc - 1) - extra_bits), added
    exactly, and the sum rounded (default toward zero) to the accumulator.
    Published models: V100 b=4 (Fasi, Higham, Mikaitis & Pranesh, PeerJ Comput.
    Sci. 7:e330, 2021), A100 b=8 and H100 b=16 with 3 extra alignment bits
    (Li et al., "FTTN: Feature-targeted testing for numerical properties of NVIDIA
    & AMD matrix accelerators", CCGrid 2024); see `TENSOR_CORE_PRESETS`.
    """

    b: int = 4
    extra_bits: int = 0
    rounding: str = field(default="toward_zero", kw_only=True)

    kind: ClassVar[str] = "blocked"
    _kind_code: ClassVar[int] = K.BLOCKED

    def _validate(self) -> None:
        for name in ("b", "extra_bits"):
            value = getattr(self, name)
            low = 1 if name == "b" else 0
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise InvalidArgument(f"{name} must be an integer >= {low}; received {value!r}")
            self._set(name, int(value))
        width = self.accumulator.precision + self.extra_bits + math.ceil(math.log2(self.b + 1))
        if width > 53:
            raise InvalidArgument(
                f"b and extra_bits must satisfy p_acc + extra_bits + ceil(log2(b + 1)) <= 53 "
                f"(exact float64 block sums); received b={self.b}, extra_bits={self.extra_bits} "
                f"with accumulator {self.accumulator}"
            )

    def _extra_params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"b": self.b}
        if self.extra_bits:
            out["extra"] = self.extra_bits
        return out

    def _describe_kind(self) -> str:
        return (f"blocked fused sum of {self.b} products plus the {self.accumulator} "
                f"accumulator, aligned with {self.extra_bits} extra bits and truncated")


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
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidArgument(f"chunk must be an integer >= 1; received {value!r}")
        self._set("chunk", int(value))
        total = resolve_format(self.total, "total")
        if total.precision > 51 and not _is_fp64(total):
            raise InvalidArgument(f"total precision must be at most 51 bits (or exactly fp64); "
                                  f"received {total.name}")
        self._set("total", total)

    def _stochastic_formats(self) -> list[tuple[Format, str]]:
        return [*super()._stochastic_formats(), (self.total, "total")]

    def _extra_params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.chunk}
        if self.total != FP32:
            out["total"] = self.total.name
        return out

    def _describe_kind(self) -> str:
        return (f"chunks of {self.chunk} terms summed in {self.accumulator}, each chunk "
                f"added to a {self.total} total")


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

TENSOR_CORE_PRESETS: dict[str, dict[str, Any]] = {
    # Fasi et al. 2021 (V100): 4-term fused, truncation, round toward zero.
    "v100": {"b": 4, "extra_bits": 0},
    # Fasi et al. 2021 / Li et al. 2024 (A100): 8-term fused, 3 extra alignment bits.
    "a100": {"b": 8, "extra_bits": 3},
    # Li et al. 2024 (H100): 16-term fused, 3 extra alignment bits.
    "h100": {"b": 16, "extra_bits": 3},
}

_KEY_ALIASES = {"extra": "extra_bits", "n": "chunk", "acc": "accumulator", "out": "output"}
_INT_KEYS = {"b", "extra_bits", "chunk", "seed"}


def parse_model(spec: str) -> AccumulationModel:
    """Build a model from a spec string.

    Grammar: ``KIND[:ACCUMULATOR][:KEY=VALUE]...`` where KIND is one of
    sequential, pairwise, blocked, chunked, exact, or a tensor-core preset
    (v100, a100, h100 = blocked fp32 with their b and extra bits); ACCUMULATOR is
    a format name (fp16, bf16, fp32, fp64, fp8_e4m3, fp8_e5m2, aliases, or
    ``p<precision>_emax<emax>``). Keys: product, addition (format or exact),
    output, total (formats), rounding (nearest_even|toward_zero|stochastic, or
    rn|rz|sr), subnormals (keep|flush), overflow (inf|saturate), seed, order
    (permutation of hwc), b, extra (extra_bits), n (chunk).
    Examples: ``sequential:fp16``, ``sequential:fp16:addition=fp32``,
    ``blocked:fp16:b=4``, ``chunked:fp16:n=64``, ``exact:fp64``, ``a100``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument(f"model spec must be a non-empty string like 'sequential:fp16'; "
                              f"received {spec!r}")
    parts = [p.strip() for p in spec.strip().split(":")]
    kind = parts[0].lower()
    kwargs: dict[str, Any] = {}
    if kind in TENSOR_CORE_PRESETS:
        cls: type[AccumulationModel] = Blocked
        kwargs.update(TENSOR_CORE_PRESETS[kind])
        kwargs["accumulator"] = FP32
    elif kind in MODEL_KINDS:
        cls = MODEL_KINDS[kind]
    else:
        raise invalid_choice("model", parts[0], (*MODEL_KINDS, *TENSOR_CORE_PRESETS))
    rest = parts[1:]
    if rest and "=" not in rest[0]:
        kwargs["accumulator"] = rest.pop(0)
    allowed = {f.name for f in fields(cls) if f.name != "_"}
    for item in rest:
        key, sep, value = item.partition("=")
        key = _KEY_ALIASES.get(key.strip().lower(), key.strip().lower())
        if not sep or key not in allowed:
            valid = sorted(allowed | {k for k, v in _KEY_ALIASES.items() if v in allowed})
            raise invalid_choice(f"{kind} model parameter", item, valid)
        if key in _INT_KEYS:
            try:
                kwargs[key] = int(value)
            except ValueError:
                raise InvalidArgument(f"{key} must be an integer; received {value!r}") from None
        else:
            kwargs[key] = value
    return cls(**kwargs)


def kernel_config(model: AccumulationModel) -> tuple[np.ndarray, np.ndarray, int]:
    """The (fp, ic, seed) arrays `_kernels.reduce_*` take for this model."""
    if not isinstance(model, AccumulationModel):
        raise InvalidArgument(f"model must be an AccumulationModel (e.g. Sequential('fp16')); "
                              f"received {model!r}")
    sub = model.subnormals
    fp = np.zeros((5, 5), dtype=np.float64)
    if model.product != _EXACT:
        fp[K.PRODUCT] = format_row(model.product, sub)
    if model.addition != _EXACT:
        fp[K.ADDITION] = format_row(model.addition, sub)
    fp[K.ACCUMULATOR] = format_row(model.accumulator, sub)
    fp[K.OUTPUT] = format_row(model.output, sub)
    if isinstance(model, Chunked):
        fp[K.TOTAL] = format_row(model.total, sub)
    ic = np.zeros(K.IC_SIZE, dtype=np.int64)
    ic[K.IC_KIND] = model._kind_code
    ic[K.IC_MODE] = ROUNDINGS.index(model.rounding)
    ic[K.IC_SAT] = int(model.overflow == "saturate")
    ic[K.IC_RBITS] = model.random_bits
    if isinstance(model, Blocked):
        ic[K.IC_B] = model.b
        ic[K.IC_EXTRA] = model.extra_bits
    if isinstance(model, Chunked):
        ic[K.IC_CHUNK] = model.chunk
    return fp, ic, model.seed
