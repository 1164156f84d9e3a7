"""Tensor-core presets: the published block-FMA parameters of NVIDIA GPUs, by name.

Sources: Khattak & Mikaitis, "Accurate Models of NVIDIA Tensor Cores", ACM TACO
(arXiv:2512.07004), and their model-validation data (real MMA inputs and outputs, BSD-2,
bundled as `convprobe/data/tensor_core_validation.npz`); cross-checked with MMA-Sim
(Xie et al., arXiv:2511.10909) and Fasi, Higham, Mikaitis & Pranesh, PeerJ Comput. Sci.
7:e330 (2021). Every preset below reproduces every bundled vector of its GPU, input and
output format bit for bit (`convprobe replay`).

Rules common to all: exact products, subnormals kept, alignment to the largest e_a + e_b,
truncation while aligning, one normalisation per block. fp32 output: each block's sum
truncated (toward zero) to fp32; fp16 output: c first rounded to fp16, each block's sum
rounded once to fp16, nearest even. Two structures came from the data rather than the
table of the paper:

* B200 fp8 (and H100 fp8 with fp16 output, captured with mma.sync m16n8k32): each
  32-product instruction is two blocks of 16 - the products at k mod 4 in {0, 1}, then
  those at {2, 3} - summed from +0 and truncated, and c is added afterwards in one
  nearest-even rounding. The single 32-product block of the paper's table matches only
  about two thirds of the B200 fp8 vectors, because that final addition of c rounds to
  nearest rather than truncating.
* H100 fp8 with fp32 output (wgmma, c = 0 in the data): one block of 32 with the
  accumulator narrowed to 13 fraction bits (e8m13), as on Ada.

No data: T4 (Turing), A40 and RTX PRO 6000 (Blackwell workstation) are not in the
literature this rests on; convprobe offers no preset for them rather than guess.
"""

from __future__ import annotations

from typing import Any

from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, TF32, Format, parse_format
from convprobe.options import CAddition, KLayout

__all__ = ["GPU_FAMILIES", "GPU_PRESETS", "INPUTS", "OUTPUTS", "tensor_core_parameters",
           "preset_spec"]

# GPU name -> family whose tensor cores it shares (Khattak & Mikaitis: A2 and A30 share
# the A100 model, H200 the H100 one, L40S the Ada one).
GPU_FAMILIES: dict[str, str] = {
    "v100": "volta", "a100": "ampere", "a2": "ampere", "a30": "ampere",
    "ada": "ada", "l40s": "ada", "h100": "hopper", "h200": "hopper", "b200": "blackwell",
}
GPU_PRESETS = tuple(GPU_FAMILIES)
INPUTS = ("fp16", "bf16", "tf32", "fp8_e4m3", "fp8_e5m2")
OUTPUTS = ("fp32", "fp16")

_FP8 = (FP8_E4M3, FP8_E5M2)
_MMA_SYNC_FP8 = {"b": 16, "extra_bits": 2, "step": 32, "layout": KLayout.PAIR_INTERLEAVED,
                 "c_addition": CAddition.SEPARATE}

# (family, input) -> block parameters with fp32 output: products per block, extra bits
_BLOCKS: dict[tuple[str, Format], dict[str, Any]] = {
    ("volta", FP16): {"b": 4, "extra_bits": 0},
    **{("ampere", f): {"b": 8, "extra_bits": 1} for f in (FP16, BF16)},
    ("ampere", TF32): {"b": 4, "extra_bits": 1},
    **{("ada", f): {"b": 8, "extra_bits": 1} for f in (FP16, BF16)},
    ("ada", TF32): {"b": 4, "extra_bits": 1},
    **{("ada", f): {"b": 16, "extra_bits": -10} for f in _FP8},
    **{("hopper", f): {"b": 16, "extra_bits": 2} for f in (FP16, BF16)},
    ("hopper", TF32): {"b": 8, "extra_bits": 2},
    **{("hopper", f): {"b": 32, "extra_bits": -10} for f in _FP8},
    **{("blackwell", f): {"b": 16, "extra_bits": 2} for f in (FP16, BF16)},
    ("blackwell", TF32): {"b": 8, "extra_bits": 2},
    **{("blackwell", f): dict(_MMA_SYNC_FP8) for f in _FP8},
}
# fp16 output where it differs from the fp32-output structure (see the module docstring)
_FP16_OUT: dict[tuple[str, Format], dict[str, Any]] = {
    **{("hopper", f): dict(_MMA_SYNC_FP8) for f in _FP8},
}


def tensor_core_parameters(gpu: str, input: str | Format = FP16,
                           output: str | Format = FP32) -> dict[str, Any]:
    """`models.Blocked` keyword arguments for `gpu`'s tensor cores with these formats."""
    key = str(gpu).strip().lower()
    if key not in GPU_FAMILIES:
        raise invalid_choice("gpu", gpu, GPU_PRESETS)
    family = GPU_FAMILIES[key]
    fin = parse_format(input, argument="in", allowed=INPUTS)
    fout = parse_format(output, argument="out", allowed=OUTPUTS)
    if (family, fin) not in _BLOCKS:
        valid = [f.name for (fam, f) in _BLOCKS if fam == family]
        raise invalid_choice(f"in for {key}", fin.name, valid)
    if fout == FP16 and fin not in (FP16, *_FP8):
        raise InvalidArgument(f"out=fp16 needs fp16 or fp8 inputs (MMA instructions give "
                              f"{fin.name} inputs fp32 results only); received in={fin.name}")
    params = dict(_FP16_OUT.get((family, fin), _BLOCKS[(family, fin)]) if fout == FP16
                  else _BLOCKS[(family, fin)])
    params.update(input=fin, adder=FP32, accumulator=fout, output=fout,
                  rounding="toward_zero" if fout == FP32 else "nearest_even")
    return params


def preset_spec(gpu: str, input: Format, output: Format) -> str:
    """The canonical spelling of a preset: ``a100``, ``a100:in=bf16``, ``v100:out=fp16``."""
    return str(gpu).strip().lower() + "".join(
        f":{key}={fmt.name}" for key, fmt, default in (("in", input, FP16), ("out", output, FP32))
        if fmt != default)
