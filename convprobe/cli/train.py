"""`convprobe train`: the ResNet fp16 harness on the command line.

`register` only adds the parser; TensorFlow is imported when the command runs,
after the configuration, the run directory and any cluster description are
validated (bad input fails fast, `--help` is instant) and after the faithful-fp16
XLA flags are in the environment. `--local-workers N` starts N worker processes of
this same command (`training.cluster.run_local_workers`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from convprobe.errors import InvalidArgument
from convprobe.options import Status

__all__ = ["register", "run", "config_from_args"]

#: How long the twin's identify may take in its configuration: ResNet-20's layers took 9 min
#: on two busy cores, above identify's own 10-minute default once the machine is loaded.
IDENTIFY_TIMEOUT_S = 3600


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train",
        help="train a CIFAR ResNet in fp16/bf16/fp32 and record gradient underflow per layer",
        description=(
            "Train a CIFAR-style ResNet v2 (depth 6n+2) with Keras mixed precision, fp32 master "
            "weights and loss scaling, and record per layer how many weight and activation "
            "gradients flush to zero or land subnormal, against an fp32 shadow on the same "
            "weights and batch. Records stream to DIR (header.json, steps.csv, telemetry.csv); "
            "rerunning the same command resumes from the last checkpoint."
        ),
        epilog=(
            "Settings the harness adds to XLA_FLAGS before TensorFlow starts (a value you set "
            "yourself is kept, and every value is recorded in header.json): "
            "--xla_allow_excess_precision=false (XLA would otherwise keep fp16 intermediates in "
            "fp32 inside a fusion); --xla_cpu_max_isa=AVX2 (on CPUs with AVX512-FP16, XLA would "
            "otherwise fuse an fp16 multiply and add into one native fp16 FMA, one rounding instead "
            "of two); --xla_cpu_parallel_codegen_split_count=1 and --xla_cpu_use_thunk_runtime=false "
            "(compile faster on small CPUs; arithmetic unchanged, re-checked at run time). "
            "TF_CPP_MIN_LOG_LEVEL=2 unless set."
        ),
    )
    p.add_argument("--dtype", default=None, help="compute dtype: fp16, bf16 or fp32 (default fp16)")
    p.add_argument("--loss-scale", default=None, metavar="{none,dynamic,NUMBER}",
                   help="none, dynamic, or a static scale; default: the dtype's default "
                        "(128 for fp16 as in the reference ResNet, none otherwise)")
    p.add_argument("--no-skip", action="store_true",
                   help="static scale: apply steps with inf/NaN gradients instead of skipping them "
                        "(the reference ResNet's behaviour)")
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--record-every", type=int, default=10, help="telemetry every K steps (default 10)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="global batch size (default 128; with --keras-model, the batch its input fixes, if one)")
    p.add_argument("--keras-model", default=None, metavar="M.keras",
                   help="train your own saved, compiled Keras model instead of the ResNet, on --data D.npz "
                        "(x_train, y_train, optionally x_test, y_test): its compiled loss and optimizer (fresh, "
                        "wrapped in the run's loss scaling), its layers under --arithmetic, every weight and "
                        "layer output watched")
    p.add_argument("--resnet-size", type=int, default=None, help="depth 6n+2: 20, 32, 56, ... (default 20)")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side: synthetic any (default 32); cifar10 and digits only their own (32, 8), "
                        "the default")
    p.add_argument("--seed", type=int, default=None, help="seed of weights, data and every RNG (default 0)")
    p.add_argument("--data", default=None,
                   help="with --keras-model: your .npz file; for the ResNet: synthetic (a learnable random task, "
                        "the default); digits (the 1797 8x8 handwritten "
                        "digits bundled with convprobe: 1297 train, 500 evaluation); or cifar10 (the binary "
                        "files you have: --data cifar10 --data-dir DIR, DIR holding data_batch_1.bin ... "
                        "data_batch_5.bin and test_batch.bin, or their cifar-10-batches-bin/ folder, from "
                        "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="with --data cifar10: the directory of CIFAR-10 binary files (data_batch_*.bin)")
    p.add_argument("--output", default=None, metavar="DIR",
                   help="run directory (default results/train_<dtype>_<scale>_seed<seed>)")
    p.add_argument("--arm", action="append", default=None, metavar="ARM",
                   help="repeatable: compare arms, each DTYPE[/LOSS_SCALE][@ARITHMETIC] (fp32, fp16/128, "
                        "fp16/dynamic, fp16/none, fp16/128@v100:out=fp16), every arm at every --seeds, each "
                        "run `convprobe train` in its own process into DIR/<arm>_seed<k>/, then "
                        "DIR/comparison.json (kind train-comparison: per run eval accuracy, final loss, "
                        "skipped steps, underflow; per arm mean and sample std) and comparison.txt; "
                        "`convprobe report DIR` draws it. Rerunning resumes, reusing finished runs")
    p.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="with --arm or --compare-loss-scaling: the seeds every arm runs at (default: --seed)")
    p.add_argument("--compare-loss-scaling", action="store_true",
                   help="shorthand for --arm DTYPE/none --arm DTYPE/S --arm DTYPE/dynamic (DTYPE --dtype, "
                        "default fp16; S --loss-scale's number or 128; @--arithmetic where given); also writes "
                        "the per-layer underflow table (underflow.txt) and figures")
    p.add_argument("--jit", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the step with XLA (default: on, with the XLA_FLAGS below; fp16 without "
                        "XLA measured ~160x slower on a 2-core CPU; off under --arithmetic other than "
                        "native; --config's own setting where one is named)")
    p.add_argument("--arithmetic", default=None, metavar="native|twin|SPEC",
                   help="what computes every conv layer's forward pass and both gradients: native "
                        "(TensorFlow's kernels, the default); twin (per layer and op, the model identify "
                        "measured in this configuration: it must reproduce TensorFlow's step bit for bit); "
                        "or one emulated model or GPU preset as a counterfactual, e.g. v100:out=fp16 (fp16 "
                        "accumulation on V100 tensor cores), a100, h100:in=fp8_e4m3, sequential:fp16")
    p.add_argument("--arithmetic-map", default=None, metavar="FILE",
                   help="with --arithmetic twin: an identify document of this run's layers (convprobe "
                        "identify --resnet-size R --image-size I --batch B --configs C --output FILE); "
                        "default: measured before the run, kept as DIR/identify.json")
    p.add_argument("--config", default=None, metavar="NAME",
                   help="TensorFlow configuration by its name in 'convprobe fingerprint --list-configs' "
                        "(e.g. onednn-off+fp16-acc), set before TensorFlow starts and recorded; default: "
                        "the environment as it is")
    p.add_argument("--distribute", default="none",
                   help="none; mirrored (tf.distribute.MirroredStrategy over --devices logical CPU devices "
                        "of this process); or multi-worker (tf.distribute.MultiWorkerMirroredStrategy: "
                        "every machine runs this command with its own TF_CONFIG; worker 0 writes the "
                        "records). Both compile each replica's forward and backward pass with XLA")
    p.add_argument("--devices", type=int, default=None,
                   help="logical CPU devices for --distribute mirrored (default 2)")
    p.add_argument("--local-workers", type=int, default=None, metavar="N",
                   help="with --distribute multi-worker: rehearse a cluster of N workers on this machine "
                        "(127.0.0.1, generated TF_CONFIGs; all stopped when done or interrupted)")
    p.add_argument("--learning-rate", type=float, default=None, help="the ResNet's SGD learning rate (default 0.1)")
    p.add_argument("--bn-momentum", type=float, default=None,
                   help="batch-norm moving-average momentum (default 0.997, the reference ResNet's; "
                        "use ~0.9 for runs of a few hundred steps)")
    p.add_argument("--eval-batches", type=int, default=None,
                   help="evaluation batches of --batch-size images at the end (default 0; 8 with --arm or "
                        "--compare-loss-scaling). digits cycles through its 500 evaluation images")
    p.add_argument("--checkpoint-every", type=int, default=50, help="checkpoint every N steps (default 50)")
    p.add_argument("--dynamic-growth-steps", type=int, default=None,
                   help="dynamic scaling: double the scale after N finite steps (default 2000)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr, drawn by rich (default: when stderr is a terminal)")
    p.set_defaults(handler=run)
    return p


def comparing(args) -> bool:
    """Whether the command runs a comparison of arms rather than one run."""
    return bool(args.arm) or args.compare_loss_scaling


def config_from_args(args):
    """Validate the parsed arguments into a `TrainConfig` (raises InvalidArgument). For a
    comparison it is the runs' shared settings (each arm sets its dtype, loss scale and
    arithmetic)."""
    from convprobe.training.config import validate_config  # the training package: not for --help

    progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    compare = comparing(args)
    if args.arm:
        _refuse_with_arms(args)
    if args.seeds is not None and not compare:
        raise InvalidArgument(f"--seeds applies to --arm or --compare-loss-scaling; received --seeds {args.seeds} "
                              f"for a single run (use --seed)")
    if args.seeds is not None and args.seed is not None:
        raise InvalidArgument(f"--seed and --seeds name the seeds twice; received --seed {args.seed} and "
                              f"--seeds {args.seeds}")
    config = validate_config(
        dtype=args.dtype or "fp16", loss_scale=args.loss_scale, skip=not args.no_skip, steps=args.steps,
        record_every=args.record_every, batch_size=_batch_size(args), resnet_size=args.resnet_size,
        image_size=args.image_size, seed=0 if args.seed is None else args.seed,
        data=args.data or ("synthetic" if args.keras_model is None else ""), keras_model=args.keras_model,
        data_dir=args.data_dir, output=args.output, jit=args.jit, distribute=args.distribute,
        logical_devices=2 if args.devices is None else args.devices,
        learning_rate=args.learning_rate, checkpoint_every=args.checkpoint_every,
        eval_batches=_eval_batches(args, compare),
        dynamic_growth_steps=2000 if args.dynamic_growth_steps is None else args.dynamic_growth_steps,
        progress=progress, bn_momentum=args.bn_momentum, arithmetic=args.arithmetic or "native",
        arithmetic_map=None if compare else args.arithmetic_map, configuration=args.config,
    )
    if not args.arm:
        _refuse_what_does_not_apply(args, config)
    elif args.devices is not None and config.distribute != "mirrored":  # the one check that holds for every arm
        raise InvalidArgument(f"--devices applies to --distribute mirrored; received --devices {args.devices} "
                              f"with --distribute {config.distribute}")
    if config.output is None:
        name = "arms" if args.arm else "compare" if args.compare_loss_scaling else config.loss_scale.label
        config = replace(config, output=f"results/train_{'' if args.arm else config.dtype + '_'}{name}"
                                        f"{'' if args.arm else f'_seed{config.seed}'}")
    return config


def _batch_size(args) -> int:
    """--batch-size, or its default: the batch a user's saved model fixes, else 128."""
    from convprobe.training.user_trainer import saved_batch_size

    if args.batch_size is not None:
        return args.batch_size
    return (saved_batch_size(args.keras_model) if args.keras_model else None) or 128


def _eval_batches(args, compare: bool) -> int:
    """--eval-batches, or its default: 8 in a comparison, where the data has a test set (a user's
    .npz may hold none), else 0."""
    from convprobe.training.data import has_test_set

    if args.eval_batches is not None:
        return args.eval_batches
    if not compare or (args.keras_model and args.data and not has_test_set(args.data)):
        return 0
    return COMPARISON_EVAL_BATCHES


#: Evaluation batches of a comparison when --eval-batches is not given: comparisons answer accuracy.
COMPARISON_EVAL_BATCHES = 8


def _refuse_with_arms(args) -> None:
    """What an arm sets is refused beside --arm, not silently overridden."""
    for flag, value in (("--dtype", args.dtype), ("--loss-scale", args.loss_scale),
                        ("--arithmetic", args.arithmetic)):
        if value is not None:
            raise InvalidArgument(f"{flag} is set by each --arm (DTYPE[/LOSS_SCALE][@ARITHMETIC]); received "
                                  f"{flag} {value} with --arm")
    if args.compare_loss_scaling:
        raise InvalidArgument("--compare-loss-scaling is shorthand for three arms; give it or --arm, not both")


def _refuse_what_does_not_apply(args, config) -> None:
    """An option the run would not use is refused, not recorded as if it had acted."""
    from convprobe.training.config import LossScaleMode

    mode = config.loss_scale.mode
    if args.devices is not None and config.distribute != "mirrored":
        raise InvalidArgument(f"--devices applies to --distribute mirrored; received --devices {args.devices} "
                              f"with --distribute {config.distribute}")
    if args.dynamic_growth_steps is not None and mode is not LossScaleMode.DYNAMIC and \
            not args.compare_loss_scaling:
        raise InvalidArgument(f"--dynamic-growth-steps applies to --loss-scale dynamic; received it with "
                              f"--loss-scale {config.loss_scale.label}")
    if args.compare_loss_scaling and args.loss_scale is not None and mode in (LossScaleMode.NONE, LossScaleMode.DYNAMIC):
        raise InvalidArgument(f"--loss-scale with --compare-loss-scaling is the static arm's scale (a number; none "
                              f"and dynamic are arms already); received --loss-scale {args.loss_scale}")
    if args.no_skip and (mode in (LossScaleMode.NONE, LossScaleMode.DYNAMIC) or args.compare_loss_scaling):
        raise InvalidArgument(f"--no-skip applies to a static --loss-scale (a number); received it with "
                              f"{'--compare-loss-scaling' if args.compare_loss_scaling else '--loss-scale ' + mode.value}")


def run(args) -> int:
    config = config_from_args(args)
    if config.data == "cifar10":  # fail on a bad directory before TensorFlow starts
        from convprobe.training.data import load_cifar10_dir

        load_cifar10_dir(config.data_dir)
    if config.keras_model is not None:
        _check_user_model(config)
    if args.local_workers is not None or config.distribute == "multi-worker":
        return _multi_worker(args, config)
    if comparing(args):
        return _compare(args, config)
    return _train(config)


def _check_user_model(config) -> None:
    """The user's model and data, checked against each other before any work: TensorFlow starts
    here, in the configuration the run will train in."""
    from convprobe.training.arithmetic import ArithmeticKind
    from convprobe.training.data import ArrayData
    from convprobe.training.runtime import apply_configuration, tensorflow
    from convprobe.training.user_trainer import check_user_model, load_user_model

    twin = config.arithmetic.kind is ArithmeticKind.TWIN
    configuration = config.configuration or ("default" if twin else None)
    data = ArrayData(config.data, seed=config.seed)  # a bad file fails before TensorFlow starts
    if configuration is not None:
        apply_configuration(configuration)
    tensorflow()  # started as the run starts it: its XLA flags set first, its start-up notices dropped
    check_user_model(load_user_model(config.keras_model), data, config)


def _compare(args, config) -> int:
    """Every arm at every seed, each run in its own process; prints the comparison's table."""
    # imported here, as every command imports its library: `convprobe --help` loads neither pandas nor TensorFlow
    from convprobe.training.arms import loss_scaling_arms, parse_arms, parse_seeds
    from convprobe.training.compare import COMPARISON_NAME, format_comparison, plan_arms, run_arms
    from convprobe.training.config import LossScaleMode

    if args.arm:
        arms = parse_arms(args.arm)
    else:
        static = config.loss_scale.scale if config.loss_scale.mode is LossScaleMode.STATIC else None
        arms = loss_scaling_arms(config.dtype, static, config.arithmetic)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else [config.seed]
    planned = plan_arms(config, arms, seeds, config.output, jit=args.jit, skip=not args.no_skip,
                        arithmetic_map=args.arithmetic_map)
    if args.arm:
        _refuse_options_no_arm_reads(args, planned)
    document = run_arms(planned, config.output, figures=args.compare_loss_scaling)
    print(format_comparison(document), end="")
    print(f"wrote {Path(config.output) / COMPARISON_NAME} and comparison.txt; draw it with: convprobe report "
          f"{config.output}")
    failed = [row["directory"] for row in document["runs"] if row["status"] != Status.OK]
    if failed:
        print(f"{len(failed)} of {len(document['runs'])} runs did not finish: {', '.join(failed)} (their "
              f"errors are above and in DIR/<run>.log); rerun the command to retry them", file=sys.stderr)
    return 0  # as a sweep: every run is a row with its status, the comparison is written


def _refuse_options_no_arm_reads(args, planned) -> None:
    """--no-skip and --dynamic-growth-steps act only on arms with a static or dynamic scale."""
    from convprobe.training.config import LossScaleMode

    modes = {run.config.loss_scale.mode for run in planned}
    if args.no_skip and LossScaleMode.STATIC_NO_SKIP not in modes:
        raise InvalidArgument("--no-skip applies to an arm with a static loss scale (DTYPE/NUMBER); received it "
                              "with arms " + ", ".join(dict.fromkeys(run.arm.label for run in planned)))
    if args.dynamic_growth_steps is not None and LossScaleMode.DYNAMIC not in modes:
        raise InvalidArgument("--dynamic-growth-steps applies to an arm with DTYPE/dynamic; received it with "
                              "arms " + ", ".join(dict.fromkeys(run.arm.label for run in planned)))


def _train(config) -> int:
    from convprobe.training.run_loop import train

    result = train(config, identify_map=_twin_map(config))
    print(f"{config.output}: {result.final_step}/{config.steps} steps, skipped {result.skipped_steps}, "
          f"non-finite {result.nonfinite_steps}, final loss {result.final_loss:.4f}, "
          f"final scale {result.final_loss_scale:g}, {result.images_per_second:.1f} img/s"
          + (f", eval accuracy {result.eval_accuracy:.4f}" if result.eval_accuracy is not None else ""))
    return 0


def _twin_map(config) -> dict | None:
    """The twin's identify map when none was named: the run directory's own (a resumed run),
    or measured now by `convprobe identify` in a child process, in the run's configuration
    and at its layers' shapes, before this process trains."""
    from pathlib import Path

    from convprobe.training.arithmetic import ArithmeticKind, read_identify_map
    from convprobe.training.records import IDENTIFY_MAP_NAME, RunFiles

    if config.arithmetic.kind is not ArithmeticKind.TWIN or config.arithmetic_map is not None:
        return None
    files = RunFiles(config.output)
    files.plan(config.to_json())  # a bad run directory fails here, before identify runs
    kept = Path(config.output) / IDENTIFY_MAP_NAME
    if files.header_path.is_file() and kept.is_file():
        return read_identify_map(kept)
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="convprobe-twin-") as scratch:
        path = Path(scratch) / IDENTIFY_MAP_NAME
        model = (["--keras-model", config.keras_model] if config.keras_model is not None else
                 ["--resnet-size", str(config.resnet_size), "--image-size", str(config.image_size)])
        command = [sys.executable, "-m", "convprobe", "identify", *model, "--batch", str(config.batch_size),
                   "--configs", config.configuration or "default", "--timeout", str(IDENTIFY_TIMEOUT_S),
                   "--output", str(path)]
        print(f"twin: measuring this run's layers: {' '.join(['convprobe', *command[3:-2]])}", file=sys.stderr)
        environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        if subprocess.run(command, stdout=sys.stderr, env=environment).returncode != 0 or not path.is_file():
            raise InvalidArgument("--arithmetic twin: identify could not measure this run's layers (its "
                                  "output is above); nothing was changed")
        return read_identify_map(path)


def _multi_worker(args, config) -> int:
    """Check the cluster (and the run directory) before TensorFlow, then run this worker, or
    with --local-workers all N of them."""
    from convprobe.training import cluster
    from convprobe.training.records import RunFiles

    if config.distribute != "multi-worker":
        raise InvalidArgument(f"--local-workers needs --distribute multi-worker; received --distribute "
                              f"{config.distribute}")
    if comparing(args):
        raise InvalidArgument(f"{'--arm' if args.arm else '--compare-loss-scaling'} runs in one process per "
                              f"run; it cannot be combined with --distribute multi-worker")
    RunFiles(config.output).plan(config.to_json())  # a bad run directory fails here, once
    if args.local_workers is None:
        cluster.read_tf_config()
        if not os.environ.get(cluster.WORKER_MARK):  # train in a child: signals reach us, not TensorFlow's wait
            return cluster.run_worker(args.argv[1:])
        return _train(config)
    if not 2 <= args.local_workers <= cluster.MAX_LOCAL_WORKERS:
        raise InvalidArgument(f"--local-workers must be an integer from 2 to {cluster.MAX_LOCAL_WORKERS}; "
                              f"received {args.local_workers}")
    if config.batch_size % args.local_workers:
        raise InvalidArgument(f"--batch-size must be a multiple of --local-workers ({args.local_workers}); "
                              f"received {config.batch_size}")
    return cluster.run_local_workers(_without(args.argv[1:], ("--local-workers", "--output"))
                                     + ["--output", config.output], args.local_workers)


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`argv` without `options` and their values (each in either form, `--name value` or
    `--name=value`)."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in options:
            skip = True
        elif not token.startswith(tuple(f"{option}=" for option in options)):
            out.append(token)
    return out
