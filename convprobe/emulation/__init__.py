"""Exact low-precision emulation engine (NumPy + numba, no TensorFlow).

The accumulation is a parameter: an `AccumulationModel` says in which formats,
order and rounding a sum of products is formed; `dot` and the convolutions run
any model bit-exactly, and `oracle` is the slow exact-rational reference they
are tested against. Modules: `rounding` (one rounding definition), `models`
(the models), `specs` (`parse_model`, the spec grammar), `composites` (split-K and lanes around any
model), `gpus` (tensor-core presets), `inputs` (input preparation), `reduction` (`dot`), `conv` (im2col
convolutions and gradients), the compiled kernels by role (`_kernel_arithmetic`:
the shared rounding routine; `_kernels_reference`: general kernels; `_kernels_fast`:
specialised ones; `_native_fp16`: the CPU's fp16 FMA and F16C conversions; `_kernels`:
which one runs),
`_block_fma` (the block-FMA adder, vectorised) with its compiled twin
`_block_fma_compiled`, and `oracle`.
"""

from convprobe.emulation import gpus, oracle
from convprobe.emulation.composites import Columns, Lanes, Reverse, Rows, SplitK
from convprobe.emulation.conv import conv2d, conv2d_backprop_filter, conv2d_backprop_input
from convprobe.emulation.models import (
    AccumulationModel,
    Blocked,
    Chunked,
    Exact,
    Pairwise,
    Sequential,
)
from convprobe.emulation.reduction import dot
from convprobe.emulation._threads import default_float_environment
from convprobe.emulation.rounding import round_to_format
from convprobe.emulation.specs import parse_model

__all__ = [
    "AccumulationModel",
    "Sequential",
    "Pairwise",
    "Blocked",
    "Chunked",
    "Exact",
    "SplitK",
    "Columns",
    "Rows",
    "Lanes",
    "Reverse",
    "parse_model",
    "default_float_environment",
    "round_to_format",
    "dot",
    "conv2d",
    "conv2d_backprop_input",
    "conv2d_backprop_filter",
    "oracle",
    "gpus",
]
