import math

import ml_dtypes
import numpy as np
import pytest

from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FORMATS, FP16, FP32, custom_format, format_of_dtype, parse_format


def _finfo(fmt):
    if fmt.dtype_name in ("float16", "float32", "float64"):
        return np.finfo(fmt.dtype)
    return ml_dtypes.finfo(fmt.dtype)


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.dtype_name))
def test_constants_match_the_storage_dtype(name):
    fmt = FORMATS[name]
    info = _finfo(fmt)
    assert fmt.max == float(info.max)
    assert fmt.tiny == float(info.smallest_normal)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.epsilon == float(info.eps)
    assert fmt.precision == info.nmant + 1
    assert fmt.unit_roundoff == fmt.epsilon / 2
    assert fmt.dtype.itemsize * 8 == fmt.bits


def test_tf32_is_fp32_range_with_fp16_precision():
    from convprobe.formats import TF32

    assert (TF32.precision, TF32.emin, TF32.emax) == (FP16.precision, FP32.emin, FP32.emax)
    assert TF32.max == float(np.float32(FP32.max)) - (2.0**(128 - 11) - 2.0**(128 - 24))
    assert TF32.smallest_subnormal == 2.0**-136 and TF32.dtype_name is None
    assert parse_format("tensorfloat32") is TF32


def test_fp16_constants_are_the_textbook_ones():
    assert (FP16.max, FP16.tiny, FP16.smallest_subnormal) == (65504.0, 2.0**-14, 2.0**-24)
    assert float(np.float16(65519)) == 65504.0  # the classic test's input rounds to fp16 max


@pytest.mark.parametrize("alias,name", [("fp16", "fp16"), ("float16", "fp16"), ("half", "fp16"),
                                        ("HALF", "fp16"), ("bfloat16", "bf16"), ("float32", "fp32"),
                                        ("double", "fp64"), ("e4m3", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")])
def test_aliases(alias, name):
    assert parse_format(alias).name == name


def test_parse_rejects_unknown_names_listing_valid_ones():
    with pytest.raises(InvalidArgument, match=r"^format must be one of fp8_e4m3, fp8_e5m2, bf16, fp16, tf32, fp32, fp64; received 'int8'$"):
        parse_format("int8")


def test_parse_can_narrow_the_allowed_set():
    with pytest.raises(InvalidArgument, match=r"^dtype must be one of fp16, bf16, fp32; received 'fp8'$"):
        parse_format("fp8", argument="dtype", allowed=("fp16", "bf16", "fp32"))
    assert parse_format(BF16, allowed=("fp16", "bf16")) is BF16


def test_default_loss_scale_follows_the_reference_resnet():
    assert FP16.default_loss_scale == 128
    assert all(f.default_loss_scale == 1 for f in FORMATS.values() if f is not FP16)


def test_format_of_dtype_round_trips():
    for fmt in (f for f in FORMATS.values() if f.dtype_name):
        assert format_of_dtype(fmt.dtype) is fmt
    with pytest.raises(InvalidArgument, match="dtype must be one of"):
        format_of_dtype(np.int8)


def test_custom_format_reproduces_fp16_constants():
    fp16_like = custom_format(11, 15)
    assert (fp16_like.max, fp16_like.tiny, fp16_like.smallest_subnormal) == (FP16.max, FP16.tiny, FP16.smallest_subnormal)
    assert custom_format(24, 127).max == FP32.max
    assert custom_format(11, 15, subnormals=False).smallest_subnormal == 2.0**-14
    assert math.isclose(custom_format(5, 4).unit_roundoff, 2.0**-5)


@pytest.mark.parametrize("precision,emax", [(1, 15), (54, 15), (11, 0), (11, 1024), (11.0, 15)])
def test_custom_format_rejects_out_of_range_parameters(precision, emax):
    with pytest.raises(InvalidArgument, match="must be an integer in"):
        custom_format(precision, emax)
