"""Arms (`DTYPE[/LOSS_SCALE][@ARITHMETIC]`): parsed once into a value, validated by the run's own
validators, and turned into the exact `convprobe train` command line of each run (no TensorFlow)."""

from __future__ import annotations

import argparse
from dataclasses import FrozenInstanceError, replace

import pytest

from conftest import main_in_process
from convprobe.cli import train as train_command
from convprobe.errors import InvalidArgument
from convprobe.training.arms import Arm, parse_arms, parse_seeds
from convprobe.training.compare import child_arguments, plan_arms
from convprobe.training.config import LossScaleMode, LossScaleSpec, validate_config


@pytest.mark.parametrize("text, dtype, mode, scale, arithmetic, label, name", [
    ("fp32", "fp32", LossScaleMode.NONE, 1.0, "native", "fp32", "fp32"),
    ("fp16", "fp16", LossScaleMode.STATIC, 128.0, "native", "fp16/128", "fp16-128"),
    ("fp16/128", "fp16", LossScaleMode.STATIC, 128.0, "native", "fp16/128", "fp16-128"),
    ("fp16/none", "fp16", LossScaleMode.NONE, 1.0, "native", "fp16/none", "fp16-none"),
    (" fp16/DYNAMIC ", "fp16", LossScaleMode.DYNAMIC, 2.0**15, "native", "fp16/dynamic", "fp16-dynamic"),
    ("fp16/0.5", "fp16", LossScaleMode.STATIC, 0.5, "native", "fp16/0.5", "fp16-0.5"),
    ("bf16", "bf16", LossScaleMode.NONE, 1.0, "native", "bf16", "bf16"),
    ("fp32/8", "fp32", LossScaleMode.STATIC, 8.0, "native", "fp32/8", "fp32-8"),
    ("fp16/128@v100:out=fp16", "fp16", LossScaleMode.STATIC, 128.0, "v100:out=fp16",
     "fp16/128@v100:out=fp16", "fp16-128--v100-out-fp16"),
    ("fp16/dynamic@twin", "fp16", LossScaleMode.DYNAMIC, 2.0**15, "twin", "fp16/dynamic@twin",
     "fp16-dynamic--twin"),
    ("fp16@sequential:fp16", "fp16", LossScaleMode.STATIC, 128.0, "sequential:fp16", "fp16/128@sequential:fp16",
     "fp16-128--sequential-fp16"),
])
def test_good_arms_parse_into_values(text, dtype, mode, scale, arithmetic, label, name):
    arm = Arm.parse(text)
    assert (arm.dtype, arm.loss_scale, arm.arithmetic.text) == (dtype, LossScaleSpec(mode, scale), arithmetic)
    assert (arm.label, arm.name, arm.run_name(2)) == (label, name, f"{name}_seed2")
    assert Arm.parse(arm.label) == arm  # the label is the arm
    with pytest.raises(FrozenInstanceError):
        arm.dtype = "fp32"


@pytest.mark.parametrize("text, part, said", [
    ("fp8", "DTYPE", "DTYPE must be one of fp16, bf16, fp32; received 'fp8'"),
    ("", "DTYPE", "received ''"),
    ("@a100", "DTYPE", "received ''"),
    ("fp16/abc", "LOSS_SCALE", "--loss-scale must be none, dynamic or a positive number"),
    ("fp16/", "LOSS_SCALE", "received ''"),
    ("fp16/-1", "LOSS_SCALE", "received '-1'"),
    ("fp16/128@v999", "ARITHMETIC", "--arithmetic must be native, twin, or a model spec or GPU preset"),
    ("fp16@", "ARITHMETIC", "received ''"),
])
def test_a_bad_arm_is_one_line_naming_the_arm_the_part_and_what_is_allowed(text, part, said):
    with pytest.raises(InvalidArgument) as caught:
        Arm.parse(text)
    message = str(caught.value)
    assert message.startswith(f"--arm {text.strip()!r} {part}: ") and said in message, message
    assert "DTYPE[/LOSS_SCALE][@ARITHMETIC]" in message and "\n" not in message


def test_repeated_arms_and_shared_directories_are_refused():
    with pytest.raises(InvalidArgument, match=r"--arm 'fp16' repeats --arm 'fp16/128' \(both are fp16/128\)"):
        parse_arms(["fp16/128", "fp16"])
    trees = parse_arms(["fp16@tree(((0) 1), accumulator=fp16)", "fp16@tree({(0) 1}, accumulator=fp16)"])
    assert trees[0].name != trees[1].name and all(t.name.startswith("fp16-128--tree_") for t in trees)
    assert len(Arm.parse("fp16@tree((" + " ".join(map(str, range(200))) + "), accumulator=fp16)").name) < 100
    with pytest.raises(InvalidArgument, match="at least once"):
        parse_arms([])


@pytest.mark.parametrize("text, seeds", [("0,1,2", [0, 1, 2]), (" 7 ", [7]), ("4294967295,0", [2**32 - 1, 0])])
def test_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text, said", [("0,,1", "comma-separated list"), ("a", "comma-separated list"),
                                        ("-1", "comma-separated list"), ("4294967296", "comma-separated list"),
                                        ("1,2,1", "(1 twice)")])
def test_bad_seeds(text, said):
    with pytest.raises(InvalidArgument, match=f"--seeds must .*{said.replace('(', '.').replace(')', '.')}"):
        parse_seeds(text)


def test_an_arm_validates_as_a_whole_run_and_chooses_its_jit(tmp_path):
    base = validate_config(data="digits", steps=3, batch_size=4, resnet_size=8, eval_batches=2)
    native = Arm.parse("fp16/dynamic").config(base, seed=1, output=str(tmp_path / "a"), jit=None)
    emulated = Arm.parse("fp16/128@v100:out=fp16").config(base, seed=1, output=str(tmp_path / "b"), jit=None)
    assert (native.jit, emulated.jit) == (True, False)
    assert (native.seed, native.data, native.image_size, native.eval_batches) == (1, "digits", 8, 2)
    assert emulated.arithmetic.text == "v100:out=fp16" and emulated.loss_scale == LossScaleSpec(LossScaleMode.STATIC, 128)
    with pytest.raises(InvalidArgument, match=r"^--arm 'fp16/128@v100:out=fp16': --arithmetic v100:out=fp16 "
                                              r"computes the convolutions in the emulator"):
        Arm.parse("fp16/128@v100:out=fp16").config(base, seed=0, output=str(tmp_path / "c"), jit=True)
    with pytest.raises(InvalidArgument, match=r"^--arm 'bf16@a100': --arithmetic a100 emulates fp16"):
        Arm.parse("bf16@a100").config(base, seed=0, output=str(tmp_path / "d"), jit=None)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    train_command.register(parser.add_subparsers())
    return parser


@pytest.mark.parametrize("arm", ["fp32", "fp16/none", "fp16/0.375", "fp16/dynamic", "fp16/128@v100:out=fp16",
                                 "fp16/dynamic@a100"])
def test_a_child_s_command_line_validates_into_exactly_the_planned_run(tmp_path, arm):
    base = validate_config(data="digits", steps=7, record_every=3, batch_size=4, resnet_size=14, eval_batches=2,
                           learning_rate=0.05, bn_momentum=0.9, checkpoint_every=5, dynamic_growth_steps=11,
                           configuration="onednn-off")
    planned = plan_arms(base, parse_arms([arm]), [3], tmp_path / "cmp")
    config = planned[0].config
    argv = child_arguments(config)
    assert argv[0] == "train" and "--no-progress" in argv
    child = train_command.config_from_args(_parser().parse_args(argv))
    assert child == replace(config, progress=False)
    assert str(child.output) == str(tmp_path / "cmp" / f"{Arm.parse(arm).name}_seed3")


def test_options_an_arm_sets_are_refused_beside_arm(tmp_path):
    for extra, said in ((["--dtype", "fp32"], "--dtype is set by each --arm"),
                        (["--loss-scale", "8"], "--loss-scale is set by each --arm"),
                        (["--arithmetic", "a100"], "--arithmetic is set by each --arm"),
                        (["--compare-loss-scaling"], "give it or --arm, not both"),
                        (["--seed", "1", "--seeds", "1,2"], "--seed and --seeds name the seeds twice"),
                        (["--no-skip"], "--no-skip applies to an arm with a static loss scale"),
                        (["--dynamic-growth-steps", "5"], "--dynamic-growth-steps applies to an arm with"),
                        (["--image-size", "16"], "--image-size must be 8 with --data digits")):
        code, out, err = main_in_process(["train", "--arm", "fp32", "--arm", "fp16/none", "--data", "digits",
                                          *extra, "--output", str(tmp_path / "cmp")])
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (extra, err)
    code, out, err = main_in_process(["train", "--seeds", "0,1", "--output", str(tmp_path / "one")])
    assert code == 2 and "--seeds applies to --arm or --compare-loss-scaling" in err
    assert not (tmp_path / "cmp").exists() and not (tmp_path / "one").exists()


def test_a_bad_arm_among_good_ones_stops_everything_before_any_run(tmp_path):
    code, out, err = main_in_process(["train", "--arm", "fp32", "--arm", "fp16/128@v100:out=fp16",
                                      "--arm", "fp16/lots", "--data", "digits", "--output", str(tmp_path / "cmp")])
    assert code == 2 and err.startswith("convprobe train: error: --arm 'fp16/lots' LOSS_SCALE:"), err
    code, out, err = main_in_process(["train", "--arm", "fp32", "--arm", "fp16/128@v100:out=fp16", "--jit",
                                      "--data", "digits", "--output", str(tmp_path / "cmp")])
    assert code == 2 and "--arm 'fp16/128@v100:out=fp16': --arithmetic v100:out=fp16 computes" in err, err
    assert not (tmp_path / "cmp").exists()
