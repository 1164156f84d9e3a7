"""Configuration and CLI boundary: no TensorFlow needed."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from convprobe.errors import InvalidArgument
from convprobe.formats import FP16, FP32, BF16
from convprobe.cli import train as command
from convprobe.training.config import LossScaleMode, parse_loss_scale, resnet_blocks_per_stage, validate_config


def parser():
    p = argparse.ArgumentParser(prog="convprobe")
    command.register(p.add_subparsers(dest="command"))
    return p


@pytest.mark.parametrize("dtype", ["int8", "fp8", "fp8_e4m3", "float64", ""])
def test_invalid_dtype_lists_valid_choices(dtype):
    with pytest.raises(InvalidArgument) as info:
        validate_config(dtype=dtype)
    assert str(info.value) == f"--dtype must be one of fp16, bf16, fp32; received {dtype!r}"


def test_cli_invalid_dtype_raises_before_tensorflow():
    args = parser().parse_args(["train", "--dtype", "int8"])
    with pytest.raises(InvalidArgument, match="--dtype must be one of fp16, bf16, fp32; received 'int8'"):
        args.handler(args)


@pytest.mark.parametrize("steps", [0, -1, -100])
def test_non_positive_steps_rejected(steps):
    args = parser().parse_args(["train", "--steps", str(steps)])
    with pytest.raises(InvalidArgument, match=rf"^--steps must be an integer from 1 to 1000000000; received {steps}$"):
        args.handler(args)


@pytest.mark.parametrize("name,value", [("record_every", 0), ("batch_size", -4), ("checkpoint_every", 0)])
def test_other_counts_rejected(name, value):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(InvalidArgument, match=f"^{flag} must be an integer from 1 to "):
        validate_config(**{name: value})


def test_default_loss_scale_follows_format():
    # fp16 -> static 128 (the reference ResNet's default), others -> no scaling.
    assert parse_loss_scale(None, FP16).mode is LossScaleMode.STATIC
    assert parse_loss_scale(None, FP16).scale == 128.0
    for fmt in (BF16, FP32):
        spec = parse_loss_scale(None, fmt)
        assert (spec.mode, spec.scale) == (LossScaleMode.NONE, 1.0)


def test_loss_scale_forms():
    assert parse_loss_scale("none", FP16).mode is LossScaleMode.NONE
    assert parse_loss_scale("dynamic", FP16).mode is LossScaleMode.DYNAMIC
    spec = parse_loss_scale("1024", FP16)
    assert (spec.mode, spec.scale, spec.label) == (LossScaleMode.STATIC, 1024.0, "static-1024")
    spec = parse_loss_scale("128", FP16, skip=False)
    assert (spec.mode, spec.label) == (LossScaleMode.STATIC_NO_SKIP, "static-128-noskip")
    assert parse_loss_scale("0.5", FP32).scale == 0.5  # a scale below 1 is legal (a "smaller loss")


@pytest.mark.parametrize("value", ["0", "-3", "inf", "nan", "big", "1e39", "1e-40"])
def test_bad_loss_scale(value):
    with pytest.raises(InvalidArgument) as info:
        parse_loss_scale(value, FP16)
    assert str(info.value) == (f"--loss-scale must be none, dynamic or a positive number from 2**-126 to "
                               f"3.40282e+38 (fp32's normal range, where the scaled loss is computed); "
                               f"received {value!r}")


def test_resnet_size():
    assert [resnet_blocks_per_stage(s) for s in (8, 20, 32, 56)] == [1, 3, 5, 9]
    for bad in (2, 21, 7, 0):
        with pytest.raises(InvalidArgument, match=rf"--resnet-size must be 6n\+2 .*received {bad}$"):
            resnet_blocks_per_stage(bad)


def test_choices_and_combinations():
    with pytest.raises(InvalidArgument, match="^--data must be one of synthetic, cifar10, digits; received 'imagenet'$"):
        validate_config(data="imagenet")
    with pytest.raises(InvalidArgument, match="^--distribute must be one of none, mirrored, multi-worker; received 'tpu'$"):
        validate_config(distribute="tpu")
    with pytest.raises(InvalidArgument, match="^--data-dir must name a directory"):
        validate_config(data="cifar10")
    with pytest.raises(InvalidArgument, match="--batch-size must be a multiple of --devices"):
        validate_config(distribute="mirrored", batch_size=5, logical_devices=2)


def test_cli_defaults_and_output_name():
    args = parser().parse_args(["train", "--progress"])
    config = command.config_from_args(args)
    assert (config.dtype, config.loss_scale.label, config.steps, config.resnet_size, config.jit) == (
        "fp16", "static-128", 100, 20, True)
    assert config.output == "results/train_fp16_static-128_seed0"
    args = parser().parse_args(["train", "--dtype", "float32", "--no-jit", "--loss-scale", "dynamic"])
    config = command.config_from_args(args)
    assert (config.dtype, config.loss_scale.mode, config.jit) == ("fp32", LossScaleMode.DYNAMIC, False)
    with pytest.raises(InvalidArgument, match="--no-skip applies to a static --loss-scale"):  # it would not act
        command.config_from_args(parser().parse_args(["train", "--loss-scale", "dynamic", "--no-skip"]))


def test_register_and_help_do_not_import_tensorflow():
    code = (
        "import sys, argparse\n"
        "from convprobe.cli import train as command\n"
        "p = argparse.ArgumentParser(); command.register(p.add_subparsers())\n"
        "p.format_help()\n"
        "import convprobe.training\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'TF imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_convprobe_cli_train_bad_input_exits_2(capsys):
    from convprobe import cli

    assert cli.main(["train", "--dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert err == "convprobe train: error: --dtype must be one of fp16, bf16, fp32; received 'int8'\n"
    assert cli.main(["train", "--steps", "0"]) == 2
    assert "--steps must be an integer from 1 to 1000000000; received 0" in capsys.readouterr().err
