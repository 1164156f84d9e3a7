"""Closed option sets, as StrEnums: the bottom layer every module validates against.

A member compares equal to its string value, so ``Rounding.NEAREST_EVEN ==
"nearest_even"`` and option strings from files or the command line keep working;
`parse_option` turns user text (or an alias) into a member or raises the one error
shape, ``rounding must be one of nearest_even, toward_zero, stochastic; received 'x'``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from convprobe.errors import InvalidArgument, invalid_choice

__all__ = ["Rounding", "Subnormals", "Overflow", "Alignment", "KLayout", "CAddition", "Positions", "Zeros", "TreeRecovery", "OutputFormat",
           "FigureFormat", "Status", "Accumulate", "Backend", "Device", "ComputeDtype", "LossScaleMode", "ArithmeticKind", "ConvOp", "Distribution", "parse_option",
           "names_or_all",
           "comma_integers"]


class Rounding(StrEnum):
    """How a value is rounded to a format (definitions: `convprobe.emulation.rounding`)."""

    NEAREST_EVEN = "nearest_even"
    TOWARD_ZERO = "toward_zero"
    STOCHASTIC = "stochastic"


class Subnormals(StrEnum):
    """Whether results below a format's smallest normal are kept or flushed to zero."""

    KEEP = "keep"
    FLUSH = "flush"


class Overflow(StrEnum):
    """What a result beyond a format's largest finite value becomes."""

    INF = "inf"
    SATURATE = "saturate"


class Alignment(StrEnum):
    """Which exponent a block-FMA adder aligns its addends to.

    ``input_exponents``: a product a*b counts with exponent e_a + e_b, each input's
    exponent clamped at its format's emin, so its significand lies in [0, 4)
    (Khattak & Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv:2512.07004;
    what real tensor cores do). ``values``: each addend's own normalised exponent.
    """

    INPUT_EXPONENTS = "input_exponents"
    VALUES = "values"


class KLayout(StrEnum):
    """The order in which one MMA instruction feeds its K products to the block adder.

    ``contiguous``: k = 0, 1, 2, ...  ``pair_interleaved``: the products at k mod 4 in
    {0, 1} first, then those at k mod 4 in {2, 3} (the two k16 halves of an fp8
    mma.sync m16n8k32, whose registers hold interleaved pairs of k).
    """

    CONTIGUOUS = "contiguous"
    PAIR_INTERLEAVED = "pair_interleaved"


class CAddition(StrEnum):
    """Where a block-FMA instruction adds its accumulator input c.

    ``fused``: c is an addend of the first block. ``separate``: the products are summed
    from +0 and c is added at the end, in one nearest-even rounding.
    """

    FUSED = "fused"
    SEPARATE = "separate"


class Positions(StrEnum):
    """The order of a filter gradient's sum over the batch positions (n, oh, ow).

    ``nhw``: image by image, each row by row (the layout's own order). ``hwn``: position by
    position, the batch innermost (XLA's CPU filter gradient under strict f16 math).
    """

    NHW = "nhw"
    HWN = "hwn"


class Zeros(StrEnum):
    """The sign of a zero result.

    ``signed``: as IEEE 754 rounds it (a negative sum that rounds to zero is -0).
    ``positive``: +0 always, as a kernel that adds its sum onto a +0-initialised output
    gives it (+0 + -0 = +0): Eigen's fp16 contraction and XLA's strict CPU conv.
    """

    SIGNED = "signed"
    POSITIVE = "positive"


class TreeRecovery(StrEnum):
    """When identify recovers an op's summation trees (thousands of crafted calls of the op).

    ``needed``: unless a spec of the measured structure already reproduces every output of
    the op on every input set, and on further seeded confirmation sets run for the purpose.
    ``always``: at every op, so that every reported spec is also checked against its tree.
    """

    NEEDED = "needed"
    ALWAYS = "always"


class OutputFormat(StrEnum):
    """What a command prints (and, with --output, writes): an aligned table, JSON or CSV."""

    TABLE = "table"
    JSON = "json"
    CSV = "csv"


class FigureFormat(StrEnum):
    """The image formats `convprobe report` writes."""

    PNG = "png"
    SVG = "svg"


class Status(StrEnum):
    """How one configuration's run ended. Every ending is a row, never a lost sweep:
    ``unsupported`` (the backend cannot run the setting here), ``failed`` (the probe raised),
    ``crashed`` (the child process died), ``timeout`` (no answer in time)."""

    OK = "ok"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"
    CRASHED = "crashed"
    TIMEOUT = "timeout"


class Accumulate(StrEnum):
    """What `--accumulate` asks of a configuration; `default` asks nothing."""

    FP16 = "fp16"
    FP32 = "fp32"
    DEFAULT = "default"


class Backend(StrEnum):
    """The backends a configuration runs on: the frameworks and the exact emulator."""

    TENSORFLOW = "tensorflow"
    EMULATED = "emulated"
    JAX = "jax"
    TORCH = "torch"


class Device(StrEnum):
    """Where TensorFlow runs a configuration. ``auto`` is a request only: it resolves to
    gpu when one is visible, else cpu; results always name cpu or gpu (the emulator's
    arithmetic runs on the cpu)."""

    CPU = "cpu"
    GPU = "gpu"
    AUTO = "auto"


ROUNDING_ALIASES = {"rn": "nearest_even", "rne": "nearest_even", "nearest": "nearest_even",
                    "rz": "toward_zero", "rtz": "toward_zero", "truncate": "toward_zero",
                    "sr": "stochastic"}

E = TypeVar("E", bound=StrEnum)


class ComputeDtype(StrEnum):
    """The compute formats the training harness runs in (variables are always fp32)."""

    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"


class LossScaleMode(StrEnum):
    """How the training loss is scaled before the backward pass."""

    NONE = "none"  # S = 1, every step applied (even a non-finite one)
    STATIC = "static"  # fixed S; a step with a non-finite gradient is skipped
    STATIC_NO_SKIP = "static-no-skip"  # fixed S, applied regardless (reference ResNet)
    DYNAMIC = "dynamic"  # keras LossScaleOptimizer: halve on inf/NaN, double after N good steps


class ArithmeticKind(StrEnum):
    """What computes a training run's convolutions (`convprobe.training.arithmetic`)."""

    NATIVE = "native"
    TWIN = "twin"
    SPEC = "spec"


class ConvOp(StrEnum):
    """The three convolutions a conv layer's training step runs (identify's op names)."""

    FORWARD = "conv2d"
    INPUT_GRADIENT = "conv2d_backprop_input"
    FILTER_GRADIENT = "conv2d_backprop_filter"


class Distribution(StrEnum):
    """The value distributions a sweep draws its rows from (`convprobe.probes.sweep`)."""

    UNIFORM01 = "uniform01"
    UNIFORM11 = "uniform11"
    NORMAL = "normal"
    HEAVY_TAILED = "heavy_tailed"


def parse_option(argument: str, value: object, options: type[E],
                 aliases: dict[str, str] | None = None) -> E:
    """The member of `options` named by `value` (case and surrounding space ignored)."""
    if not isinstance(value, str):
        # A StrEnum's values are all strings: a value of another type names no member
        # (the lookup would raise ValueError), so it takes the same error here.
        raise invalid_choice(argument, value, [m.value for m in options])
    key = value.strip().lower()
    if aliases:
        key = aliases.get(key, key)
    try:
        return options(key)
    except ValueError:
        raise invalid_choice(argument, value, [m.value for m in options]) from None


def names_or_all(value, choices, argument: str) -> tuple[str, ...]:
    """The names a user chose from `choices`: 'all', a comma-separated list or a list of
    names, in the user's order without repeats; one error naming the allowed names for an
    unknown or empty choice."""
    allowed = (*choices, "all")
    if isinstance(value, str):
        value = list(choices) if value.strip() == "all" else value.split(",")
    given = [str(name).strip() for name in value]
    chosen = [name for name in given if name]
    if chosen == ["all"]:
        chosen = list(choices)
    if not chosen:
        raise invalid_choice(argument, "", allowed)
    if len(chosen) < len(given):  # 'a,,b' or 'a,': an empty name is no name to drop silently
        raise InvalidArgument(f"{argument} lists an empty name in {','.join(given)!r}; give names from "
                              f"{', '.join(allowed)} separated by single commas")
    if "all" in chosen:
        raise InvalidArgument(f"{argument} 'all' names every one of {', '.join(choices)} and stands alone; "
                              f"received {','.join(chosen)!r}: give all, or list names")
    for name in chosen:
        if name not in choices:
            raise invalid_choice(argument, name, allowed)
    return tuple(dict.fromkeys(chosen))


def comma_integers(text) -> tuple[int, ...] | None:
    """'8,32,32,16' -> (8, 32, 32, 16); None where a part is not an integer or nothing is
    given (each caller says what it allows)."""
    try:
        values = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        return None
    return values or None
