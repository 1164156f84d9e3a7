"""Kernel plans: a model compiled into one program of additions, which one compiled kernel
runs (`_plan_kernel`), instead of a kernel written for each combination of model options.

A program is a list of steps on registers; each register holds a tile of outputs (rows of
the GEMM by its columns), so every step runs as one vector loop:

* ``ZERO r``: r = +0;
* ``LOAD r k``: r = product k (rounded to fp16 first where the step says so);
* ``MOVE r s``: r = s;
* ``ADD_LEAF r k f``: r = round_f(r + product k);
* ``ADD r s f``: r = round_f(r + s);
* ``ROUND r f``: r = round_f(r), a lone rounding (an fp16 output, say);

and the result is register 0. ``round_f`` is the exact sum rounded once to fp16 or fp32,
nearest even, subnormals kept, overflow to inf; an fp16 step of a model with
``addition=fp32`` rounds the sum to fp32 first (CPU half arithmetic).

A model writes its own steps (`emit`) over a list of items, each a product (its index) or
a register holding a partial result (`Partial`), into a register of its choice, using
registers above it as scratch. So a composite compiles whole: split-K and lanes emit their
inner model over each range or lane into registers of their own, then their combine model
over those `Partial`s; a pairwise sum or a recovered tree needs as many registers as it
is deep.

Why float32 lanes are exact here: on fp16 (or narrower) inputs every product has at most
22 significand bits and is a float32 number, and every value a step leaves is an fp16 or
fp32 number, so an fp32 step is the float32 addition (IEEE: the exact sum rounded once),
an fp16 step after an fp32 addition is that addition converted by F16C, and an exact fp16
step is the sum rounded to odd in float32 (TwoSum, `add_odd32`), then converted: 24 bits
>= 11 + 2, so it is rounded once (Boldo & Melquiond). Every value is a multiple of 2**-48
(the least fp16 product), far above float32's subnormals, which TwoSum needs.

The references are each model's general kernel, composite evaluation or the tree's exact
evaluation (tested bit for bit, tests/emulation/test_plan.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import numpy as np

from convprobe.emulation import _native_fp16, _plan_kernel
from convprobe.emulation._plan_kernel import ADD32, FMA16, HALF, PRODUCT16, run_pairs, run_program
from convprobe.formats import FP16, FP32, Format

__all__ = ["ADD32", "FMA16", "HALF", "PRODUCT16", "Op", "Partial", "Program", "ProgramBuilder", "NotPlannable", "compile_model", "fits_memory", "plannable", "run",
           "run_rows"]

_EXACT = "exact"


class Op(enum.IntEnum):
    """A program step's operation (module docstring): the kernel's step codes."""

    ZERO = _plan_kernel.ZERO
    LOAD = _plan_kernel.LOAD
    ADD_LEAF = _plan_kernel.ADD_LEAF
    ADD = _plan_kernel.ADD
    ROUND = _plan_kernel.ROUND
    MOVE = _plan_kernel.MOVE


class NotPlannable(Exception):
    """A model (or a node of its tree) that a program cannot express: formats other than fp16
    and fp32, rounding other than nearest even, flushed subnormals, saturation, a fused
    sum of more than two items, or a model kind with no steps."""


@dataclass(frozen=True)
class Partial:
    """An item that is a register's value (a partial result), not a product."""

    register: int


Item = Union[int, Partial]


@dataclass(frozen=True)
class Program:
    """Steps (n, 4: op, register, leaf or register, flags) and how many registers they use."""

    steps: np.ndarray
    registers: int


def _format_code(fmt: Format) -> int:
    if fmt == FP16:
        return HALF
    if fmt == FP32:
        return 0
    raise NotPlannable(f"{fmt.name} is not fp16 or fp32")


def plannable(model) -> bool:
    """Whether `model`'s own options fit a program (parts, such as a tree's nodes or a
    composite's inner models, are checked as its steps are written): nearest even,
    subnormals kept, overflow to inf, fp16 or fp32 accumulator, total and output, products
    exact or rounded to fp16 (or fp32, exact anyway), additions exact or in fp32; and the
    CPU converts fp16 in hardware (F16C)."""
    if not _native_fp16.available(fma=False):
        return False
    if (model.rounding, model.subnormals, model.overflow) != ("nearest_even", "keep", "inf"):
        return False
    formats = [model.accumulator, model.output, getattr(model, "total", FP32)]
    return (all(f in (FP16, FP32) for f in formats) and model.product in (_EXACT, FP16, FP32)
            and model.addition in (_EXACT, FP32))


class ProgramBuilder:
    """Steps written one by one, each for the model whose arithmetic it is (its accumulator
    is the default format, its product and addition formats apply); `program()`, the
    finished program."""

    def __init__(self):
        self._steps: list[tuple[int, int, int, int]] = []
        self._registers = 1
        self._fp16: dict[int, bool] = {}  # register -> it holds an fp16 value now

    @staticmethod
    def _flags(model, fmt: Format | None, addition: bool) -> int:
        if not plannable(model):
            raise NotPlannable(f"{model.to_spec()} has options a program cannot express")
        code = _format_code(fmt or model.accumulator)
        if code == HALF and addition and model.addition == FP32:
            code |= ADD32
        return code | (PRODUCT16 if model.product == FP16 else 0)

    def _step(self, op: Op, register: int, argument: int = 0, flags: int = 0) -> None:
        """Append one step. An exact fp16 addition of two fp16 values takes the float32 sum
        converted to fp16 (the `ADD32` step): double rounding through 24 bits >= 2 * 11 + 2
        is innocuous for a sum (Figueroa, "When is double rounding innocuous?", SIGNUM
        Newsletter 30(3), 1995), and it costs a third of the TwoSum route. An exact fp16
        step of an exact product onto an fp16 value is marked `FMA16`: the fp16 fused
        multiply-add, where the CPU has one. Which registers hold fp16 values is tracked
        step by step to know."""
        if op in (Op.ADD_LEAF, Op.ADD) and flags & HALF and not flags & ADD32:
            operand_fp16 = bool(flags & PRODUCT16) if op == Op.ADD_LEAF else self._fp16.get(argument, False)
            if self._fp16.get(register, False):
                flags |= ADD32 if operand_fp16 else FMA16 if op == Op.ADD_LEAF else 0
        reads = argument if op in (Op.ADD, Op.MOVE) else 0
        self._registers = max(self._registers, register + 1, reads + 1)
        self._steps.append((int(op), register, argument, flags))
        self._fp16[register] = {Op.ZERO: True, Op.LOAD: bool(flags & PRODUCT16),
                                Op.MOVE: self._fp16.get(argument, False)}.get(op, bool(flags & HALF))

    def zero(self, register: int) -> None:
        self._step(Op.ZERO, register)

    def take(self, model, register: int, item: Item) -> None:
        """register = the item's value: a product or a partial, rounded as `model` rounds its
        products (a composite's partial results enter its combine as products with 1)."""
        flags = self._flags(model, None, False)
        if isinstance(item, Partial):
            if item.register != register:
                self._step(Op.MOVE, register, item.register)
            if flags & PRODUCT16:
                self._step(Op.ROUND, register, 0, HALF)
        else:
            self._step(Op.LOAD, register, item, flags & PRODUCT16)

    def add(self, model, register: int, item: Item, fmt: Format | None = None, *, addition: bool = True) -> None:
        """register = round(register + the item's value), in `fmt` (default: the model's
        accumulator); `addition`: the model's addition format applies."""
        flags = self._flags(model, fmt, addition)
        if isinstance(item, Partial):
            if flags & PRODUCT16:  # (each partial is read once: rounded where it is)
                self._step(Op.ROUND, item.register, 0, HALF)
            self._step(Op.ADD, register, item.register, flags & ~PRODUCT16)
        else:
            self._step(Op.ADD_LEAF, register, item, flags)

    def combine(self, model, register: int, other: int, fmt: Format | None = None, *, addition: bool = True) -> None:
        """register = round(register + other register), a model's own partial results (no
        product rounding)."""
        self._step(Op.ADD, register, other, self._flags(model, fmt, addition) & ~PRODUCT16)

    def round(self, model, register: int, fmt: Format | None = None) -> None:
        """A lone rounding of the register to `fmt` (fp32: the values are float32 already)."""
        if self._flags(model, fmt, False) & HALF:
            self._step(Op.ROUND, register, 0, HALF)

    def program(self) -> Program:
        return Program(np.asarray(self._steps, np.int64).reshape(-1, 4), self._registers)


def compile_model(model, k: int) -> Program:
    """`model`'s sums of k products as a program (register 0 holds the result); raises
    `NotPlannable` where a part of it cannot be expressed."""
    steps = ProgramBuilder()
    model.emit(steps, list(range(k)), 0)
    return steps.program()


#: The most memory one task's registers may take (split-K of thousands of ranges holds a
#: register per range).
REGISTER_BYTES = 64 * 2**20


def fits_memory(program: Program, columns: int) -> bool:
    """Whether a task's registers for this program over `columns` GEMM columns fit
    `REGISTER_BYTES`."""
    channels = min(columns, _plan_kernel.CHANNELS)
    return program.registers * _plan_kernel.LANES * channels * 4 <= REGISTER_BYTES


def run(program: Program, a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int, *,
        fp16_fma: bool | None = None) -> None:
    """out[:, col0:col0 + N] = the program's sums of a (M, K) against w (K, N): float32
    arrays holding fp16 (or narrower) values; out float32. `fp16_fma`: whether `FMA16`
    steps run on the CPU's fp16 FMA (default: where it has one; `_native_fp16.use_fp16_fma`)."""
    run_program(np.ascontiguousarray(a), np.ascontiguousarray(w), program.steps, program.registers, out, col0,
                _native_fp16.use_fp16_fma(fp16_fma))


def run_rows(program: Program, a: np.ndarray, b: np.ndarray, *, fp16_fma: bool | None = None) -> np.ndarray:
    """The program's sums of a[m, :] * b[m, :] for each row m (`dot`): float16 arrays (M, K),
    widened by F16C in the kernel; float32 results. `fp16_fma` as in `run`."""
    out = np.empty(a.shape[0], np.float32)
    run_pairs(np.ascontiguousarray(a, np.float16).view(np.uint16), np.ascontiguousarray(b, np.float16).view(np.uint16),
              program.steps, program.registers, out, _native_fp16.use_fp16_fma(fp16_fma))
    return out
