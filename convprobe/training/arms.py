"""Arms of a training comparison: `DTYPE[/LOSS_SCALE][@ARITHMETIC]`, parsed once.

An arm is what differs between the runs of a comparison: the compute dtype, the loss
scale and the arithmetic of every convolution (`fp32`, `fp16/128`, `fp16/dynamic`,
`fp16/none`, `fp16/128@v100:out=fp16`). `Arm.parse` checks each part with the
validators a single run uses (`parse_format`, `parse_loss_scale`, `Arithmetic.parse`)
and `Arm.config` the whole run (`validate_config`), so that a bad arm is one line naming
the arm, the part and what is allowed, before any run starts. No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, fields
from enum import StrEnum

from convprobe.errors import InvalidArgument, is_integer
from convprobe.formats import parse_format
from convprobe.options import comma_integers
from convprobe.training.arithmetic import Arithmetic, ArithmeticKind
from convprobe.training.config import (
    DTYPES,
    MAX_SEED,
    LossScaleMode,
    LossScaleSpec,
    TrainConfig,
    parse_loss_scale,
    validate_config,
)

__all__ = ["ARM_GRAMMAR", "ArmPart", "Arm", "parse_arms", "parse_seeds", "loss_scaling_arms"]

ARM_GRAMMAR = ("DTYPE[/LOSS_SCALE][@ARITHMETIC], e.g. fp32, fp16/128, fp16/dynamic, fp16/none, "
               "fp16/128@v100:out=fp16")

#: Longest run-directory stem an arm gets before it is shortened with a digest (tree specs are long).
_MAX_NAME = 80


class ArmPart(StrEnum):
    """The parts of an arm, as error messages name them."""

    DTYPE = "DTYPE"
    LOSS_SCALE = "LOSS_SCALE"
    ARITHMETIC = "ARITHMETIC"


def _bad(text: str, part: ArmPart | None, why: str) -> InvalidArgument:
    where = f" {part}" if part is not None else ""
    return InvalidArgument(f"--arm {text!r}{where}: {why} (an arm is {ARM_GRAMMAR})")


@dataclass(frozen=True)
class Arm:
    """One arm: compute dtype, loss scale (resolved: the dtype's default where none was
    given) and arithmetic (parsed: native, twin or a model spec)."""

    dtype: str
    loss_scale: LossScaleSpec
    arithmetic: Arithmetic = field(default_factory=lambda: Arithmetic.parse(ArithmeticKind.NATIVE))

    @classmethod
    def parse(cls, text: str) -> Arm:
        """`DTYPE[/LOSS_SCALE][@ARITHMETIC]`; split at the first '@' (a spec may hold more)
        and then at the first '/'."""
        raw = str(text).strip()
        head, at, arithmetic_text = raw.partition("@")
        dtype_text, slash, scale_text = head.partition("/")
        try:
            fmt = parse_format(dtype_text.strip(), argument=str(ArmPart.DTYPE), allowed=DTYPES)
        except InvalidArgument as error:
            raise _bad(raw, ArmPart.DTYPE, str(error)) from None
        try:
            scale = parse_loss_scale(scale_text.strip() if slash else None, fmt)
        except InvalidArgument as error:
            raise _bad(raw, ArmPart.LOSS_SCALE, str(error)) from None
        try:
            arithmetic = Arithmetic.parse(arithmetic_text) if at else Arithmetic.parse(ArithmeticKind.NATIVE)
        except InvalidArgument as error:
            raise _bad(raw, ArmPart.ARITHMETIC, str(error)) from None
        return cls(fmt.name, scale, arithmetic)

    @property
    def scale_text(self) -> str:
        """The loss scale as --loss-scale takes it: none, dynamic or the number."""
        if self.loss_scale.mode in (LossScaleMode.NONE, LossScaleMode.DYNAMIC):
            return self.loss_scale.mode.value
        scale = float(self.loss_scale.scale)
        return str(int(scale)) if scale.is_integer() else repr(scale)

    @property
    def label(self) -> str:
        """The arm in canonical form: the loss scale shown unless it is none and the dtype's
        default is none (`fp32`), the arithmetic unless native."""
        default_none = parse_format(self.dtype).default_loss_scale == 1
        scale = "" if default_none and self.loss_scale.mode is LossScaleMode.NONE else f"/{self.scale_text}"
        arithmetic = "" if self.arithmetic.kind is ArithmeticKind.NATIVE else f"@{self.arithmetic.text}"
        return f"{self.dtype}{scale}{arithmetic}"

    @property
    def name(self) -> str:
        """The label as a directory name: '/', '@', ':' and '=' become '-' ('@' doubled).
        A label with any other character outside [A-Za-z0-9.] (a tree spec's brackets, a
        format's '_') has them as '_' and a digest of the label appended, so that two arms never
        share a name; a long one is cut before its digest."""
        name = re.sub(r"[/:=]", "-", self.label.replace("@", "--"))
        if re.fullmatch(r"[A-Za-z0-9.]*", self.label.replace("@", "").replace("/", "").replace(":", "")
                        .replace("=", "")):
            return name
        name = re.sub(r"[^A-Za-z0-9._+-]", "_", name)
        digest = hashlib.sha256(self.label.encode()).hexdigest()[:8]
        return f"{name[:_MAX_NAME]}-{digest}"

    def run_name(self, seed: int) -> str:
        """The run directory of this arm at `seed`: `<name>_seed<k>`."""
        return f"{self.name}_seed{seed}"

    def config(self, base: TrainConfig, *, seed: int, output: str, jit: bool | None,
               skip: bool = True, arithmetic_map: str | None = None) -> TrainConfig:
        """The run of this arm at `seed`: `base`'s shared settings with the arm's dtype, loss
        scale and arithmetic, validated as one run (`validate_config`; `jit` None lets the arm
        choose: XLA unless its arithmetic is emulated). `arithmetic_map` applies to a twin arm."""
        shared = {f.name: getattr(base, f.name) for f in fields(TrainConfig)}
        for name in ("loss_scale", "keras_model_sha256", "data_sha256"):  # the arm's, or the files' own
            shared.pop(name)
        defaults = TrainConfig()
        if self.loss_scale.mode is not LossScaleMode.DYNAMIC:  # what the run's own command line would hold
            shared["dynamic_growth_steps"] = defaults.dynamic_growth_steps
        if base.distribute != "mirrored":
            shared["logical_devices"] = defaults.logical_devices
        shared.update(dtype=self.dtype, loss_scale=self.scale_text, skip=skip, arithmetic=self.arithmetic,
                      seed=seed, output=output, jit=jit,
                      arithmetic_map=arithmetic_map if self.arithmetic.kind is ArithmeticKind.TWIN else None)
        try:
            return validate_config(**shared)
        except InvalidArgument as error:
            raise _bad(self.label, None, str(error)) from None


def parse_arms(texts: list[str]) -> list[Arm]:
    """Every --arm, parsed; the same arm twice, or two arms sharing a directory name, refused."""
    arms: list[Arm] = []
    seen: dict[str, str] = {}
    for text in texts:
        arm = Arm.parse(text)
        for earlier in arms:
            if earlier == arm:
                raise InvalidArgument(f"--arm {text!r} repeats --arm {seen[earlier.name]!r} (both are "
                                      f"{arm.label}); give each arm once")
            if earlier.name == arm.name:
                raise InvalidArgument(f"--arm {text!r} and --arm {seen[earlier.name]!r} would share the run "
                                      f"directory {arm.name}_seed<k>; give arms that differ in more than "
                                      f"punctuation")
        arms.append(arm)
        seen[arm.name] = text
    if not arms:
        raise InvalidArgument("--arm must be given at least once; received none")
    return arms


def parse_seeds(text: str) -> list[int]:
    """`0,1,2` -> [0, 1, 2]: integers from 0 to 2**32 - 1, each once."""
    seeds: list[int] = []
    for seed in comma_integers(text) or (None,):
        if seed is None or not is_integer(seed) or not 0 <= seed <= MAX_SEED:
            raise InvalidArgument(f"--seeds must be a comma-separated list of integers from 0 to 2**32 - 1 "
                                  f"(e.g. 0,1,2); received {text!r}")
        if seed in seeds:
            raise InvalidArgument(f"--seeds must name each seed once; received {text!r} ({seed} twice)")
        seeds.append(seed)
    return seeds


def loss_scaling_arms(dtype: str = "fp16", static_scale: float | None = None,
                      arithmetic: Arithmetic | None = None) -> list[Arm]:
    """`--compare-loss-scaling`: DTYPE/none, DTYPE/S and DTYPE/dynamic (S the given scale, else
    the dtype's default where it scales, else 128), each under `arithmetic`."""
    fmt = parse_format(dtype, argument="--dtype", allowed=DTYPES)
    static = static_scale or (fmt.default_loss_scale if fmt.default_loss_scale > 1 else 128.0)
    suffix = "" if arithmetic is None or arithmetic.kind is ArithmeticKind.NATIVE else f"@{arithmetic.text}"
    scale = str(int(static)) if float(static).is_integer() else repr(float(static))
    return parse_arms([f"{fmt.name}/none{suffix}", f"{fmt.name}/{scale}{suffix}", f"{fmt.name}/dynamic{suffix}"])
