"""Kernel plans: a model compiled into one program of additions, which one compiled kernel
runs (`_plan_kernel`), instead of a kernel written for each combination of model options.

A program is a list of steps on registers; each register holds a tile of outputs (rows of
the GEMM by its columns), so every step runs as one vector loop:

* ``ZERO r``: r = +0;
* ``LOAD r k``: r = product k (rounded to the product format where it has one);
* ``ADD_LEAF r k f``: r = round_f(r + product k);
* ``ADD r s f``: r = round_f(r + s);
* ``ROUND r f``: r = round_f(r), a lone rounding;

and the result is register 0 rounded to the output format. ``round_f`` is the exact sum
rounded once to fp16 or fp32, nearest even, subnormals kept, overflow to inf; an fp16 step
of a model with ``addition=fp32`` rounds the sum to fp32 first (CPU half arithmetic).

Why float32 lanes are exact here: on fp16 (or narrower) inputs every product has at most
22 significand bits and is a float32 number, and every value a step leaves is an fp16 or
fp32 number, so an fp32 step is the float32 addition (IEEE: the exact sum rounded once),
an fp16 step after an fp32 addition is that addition converted by F16C, and an exact fp16
step is the sum rounded to odd in float32 (TwoSum, `add_odd32`), then converted: 24 bits
>= 11 + 2, so it is rounded once (Boldo & Melquiond). Every value is a multiple of 2**-48
(the least fp16 product), far above float32's subnormals, which TwoSum needs.

Models give their own programs (`Sequential`, `Chunked`, `Pairwise`, `Tree`); composites
run their inner models' programs and add the parts as they always did. The reference
for every program is the model's general kernel or the tree's exact evaluation (tested bit
for bit, tests/emulation/test_plan.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from convprobe.emulation import _native_fp16
from convprobe.emulation._plan_kernel import HALF, ADD32, run_program
from convprobe.formats import FP16, FP32, Format

__all__ = ["Op", "Program", "ProgramBuilder", "NotPlannable", "plannable", "run"]

_EXACT = "exact"


class Op(enum.IntEnum):
    """A program step's operation (module docstring); the kernel reads the same codes."""

    ZERO = 0
    LOAD = 1
    ADD_LEAF = 2
    ADD = 3
    ROUND = 4


class NotPlannable(Exception):
    """A model (or a node of its tree) that a program cannot express: formats other than fp16
    and fp32, rounding other than nearest even, flushed subnormals, saturation, or a fused
    sum of more than two items."""


@dataclass(frozen=True)
class Program:
    """Steps (n, 4: op, register, leaf or register, flags), how many registers they use,
    whether products are rounded to fp16 first, and whether the output is fp16."""

    steps: np.ndarray
    registers: int
    product_fp16: bool
    output_fp16: bool


def _format_code(fmt: Format) -> int:
    if fmt == FP16:
        return HALF
    if fmt == FP32:
        return 0
    raise NotPlannable(f"{fmt.name} is not fp16 or fp32")


def plannable(model) -> bool:
    """Whether `model`'s options fit a program (its tree's node formats are checked as the
    program is built): nearest even, subnormals kept, overflow to inf, fp16 or fp32
    accumulator, total and output, products exact or rounded to fp16 (or fp32, exact
    anyway), additions exact or in fp32; and the CPU converts fp16 in hardware (F16C)."""
    if not _native_fp16.available(fma=False):
        return False
    if (model.rounding, model.subnormals, model.overflow) != ("nearest_even", "keep", "inf"):
        return False
    formats = [model.accumulator, model.output, getattr(model, "total", FP32)]
    return (all(f in (FP16, FP32) for f in formats) and model.product in (_EXACT, FP16, FP32)
            and model.addition in (_EXACT, FP32))


class ProgramBuilder:
    """Steps written one by one; `program()` the finished program. Formats default to the
    model's accumulator; `addition` applies to the model's own additions (not, say, a
    chunked model's total)."""

    def __init__(self, model):
        if not plannable(model):
            raise NotPlannable(f"{model.to_spec()} has options a program cannot express")
        self._model, self._steps, self._registers = model, [], 1

    def _flags(self, fmt: Format | None, addition: bool) -> int:
        code = _format_code(fmt or self._model.accumulator)
        return code | (ADD32 if code == HALF and addition and self._model.addition == FP32 else 0)

    def _step(self, op: Op, register: int, argument: int = 0, flags: int = 0) -> None:
        self._registers = max(self._registers, register + 1, (argument + 1) if op == Op.ADD else 0)
        self._steps.append((int(op), register, argument, flags))

    def zero(self, register: int) -> None:
        self._step(Op.ZERO, register)

    def load(self, register: int, leaf: int) -> None:
        self._step(Op.LOAD, register, leaf)

    def add_leaf(self, register: int, leaf: int, fmt: Format | None = None) -> None:
        self._step(Op.ADD_LEAF, register, leaf, self._flags(fmt, True))

    def add(self, register: int, other: int, fmt: Format | None = None, *, addition: bool = True) -> None:
        self._step(Op.ADD, register, other, self._flags(fmt, addition))

    def round(self, register: int, fmt: Format | None = None) -> None:
        self._step(Op.ROUND, register, 0, self._flags(fmt, True))

    def program(self) -> Program:
        steps = np.asarray(self._steps, np.int64).reshape(-1, 4)
        return Program(steps, self._registers, self._model.product == FP16, self._model.output == FP16)


def run(program: Program, a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int) -> None:
    """out[:, col0:col0 + N] = the program's sums of a (M, K) against w (K, N): float32
    arrays holding fp16 (or narrower) values; out float32."""
    run_program(np.ascontiguousarray(a), np.ascontiguousarray(w), program.steps, program.registers,
                program.product_fp16, program.output_fp16, out, col0)
