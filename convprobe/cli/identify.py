"""`convprobe identify`: the emulator model that reproduces an op bit for bit.

Two modes. The battery (default): seeded dot products of length K through each op,
the match fraction per K (`identify.battery`). A layer (`--input-shape` and
`--filter-shape`) or a network's every distinct conv layer (`--keras-model`,
`--resnet-size`): each layer's forward conv and both gradients measured at its
own shape, then confirmed (`identify.layer_identify`). Everything is checked before
any configuration starts.
"""

from __future__ import annotations

from convprobe.cli.options import (MAX_K, MAX_ROWS, add_matrix_options, announce_inherited_switches,
                                   bounded_int, emit, int_list, list_configs, matrix_configs,
                                   matrix_ops)
from convprobe.errors import InvalidArgument, reason
from convprobe.files import check_model_file
from convprobe.options import TreeRecovery, comma_integers

__all__ = ["register"]

_DEFAULT_OPS = "conv2d,conv2d_backprop_input,conv2d_backprop_filter"
#: The batch of a model's layers where neither --batch nor the model fixes one.
DEFAULT_BATCH = 4
MAX_THREADS = 1024


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "identify",
        help="find the emulator model that reproduces an op bit for bit, per K or at your own layers",
        description=(
            "Battery mode: run seeded random dot products of length K (16 ... 8192; conv2d and conv2d_spatial to 16384) "
            "through each op and "
            "search the emulator's model family for the one that matches bit for bit. Layer mode "
            "(--input-shape/--filter-shape, --keras-model or --resnet-size): measure each layer's "
            "forward conv and both gradients at the layer's own shape with crafted inputs "
            "(accumulator, partial-sum boundaries, lanes, product rounding), then confirm the "
            "measured model on seeded random inputs."
        ),
    )
    add_matrix_options(parser, default_ops=_DEFAULT_OPS, timeout=600)
    parser.add_argument("--candidates", metavar="SPECS",
                        help="comma-separated model specs to search instead of the default family "
                             "(layer mode: tried beside the measured ones)")
    parser.add_argument("--ks", type=int_list(1, MAX_K), default=None, metavar="K,K,...",
                        help=f"battery: reduction lengths, 1 to {MAX_K} (default: 16,32,...,8192, and 16384 for conv2d and conv2d_spatial)")
    parser.add_argument("--rows", type=bounded_int(1, MAX_ROWS), default=None,
                        help=f"battery: dot products per K, 1 to {MAX_ROWS} (default: 64)")
    parser.add_argument("--threads", type=bounded_int(1, MAX_THREADS), default=None, metavar="N",
                        help="pin TensorFlow's intra-op threads (TF_NUM_INTRAOP_THREADS) in every "
                             "configuration (default: what your TensorFlow uses); recorded in provenance")
    layer = parser.add_argument_group("layer mode")
    layer.add_argument("--input-shape", metavar="N,H,W,C", help="the layer's NHWC input shape")
    layer.add_argument("--filter-shape", metavar="KH,KW,CIN,COUT", help="the layer's HWIO filter shape")
    layer.add_argument("--strides", default="1", metavar="S[,S]", help="strides (default: 1)")
    layer.add_argument("--padding", default="SAME", metavar="SAME|VALID", help="padding (default: SAME)")
    layer.add_argument("--dilation", default="1", metavar="D[,D]", help="dilation (default: 1)")
    layer.add_argument("--keras-model", metavar="PATH",
                       help="a saved Keras model: every distinct Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D, "
                            "Conv2DTranspose and Dense layer (any other layer with a kernel listed with the reason)")
    layer.add_argument("--resnet-size", type=int, default=None, metavar="DEPTH",
                       help="the training harness's ResNet (6n+2: 20, 32, ...): every distinct conv layer")
    layer.add_argument("--trees", choices=[mode.value for mode in TreeRecovery], default=None,
                       help="when to recover each op's summation trees: needed (unless a measured spec already "
                            "reproduces every output on the input sets and on further seeded ones) or always "
                            "(default: needed)")
    layer.add_argument("--batch", type=bounded_int(1, 4096), default=None, metavar="N",
                       help="batch size of --keras-model/--resnet-size layers (default: the batch the model's input "
                            "fixes, else 4)")
    layer.add_argument("--image-size", type=bounded_int(8, 1024), default=None, metavar="PX",
                       help="--resnet-size image side (default: 32)")
    parser.set_defaults(handler=run)


def _pair(text: str, argument: str) -> tuple[int, int]:
    values = comma_integers(text) or ()
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < 1:
        raise InvalidArgument(f"{argument} must be one or two comma-separated positive integers; received {text!r}")
    return values


def layers_from_args(args) -> tuple[list, list] | None:
    """The layers to identify and the model's conv-like layers it cannot measure, each with its
    reason (None in battery mode); every check happens here, before work."""
    from convprobe.probes.layers import Layer, parse_shape

    modes = [name for name, given in (("--input-shape/--filter-shape", args.input_shape or args.filter_shape),
                                      ("--keras-model", args.keras_model),
                                      ("--resnet-size", args.resnet_size is not None)) if given]
    if args.image_size is not None and args.resnet_size is None:
        raise InvalidArgument("--image-size applies to --resnet-size only")
    if not modes:
        if args.batch is not None:
            raise InvalidArgument("--batch applies to --keras-model and --resnet-size only")
        if args.trees is not None:
            raise InvalidArgument("--trees applies to layer mode (--input-shape/--filter-shape, --keras-model, "
                                  "--resnet-size)")
        if args.strides != "1" or args.padding != "SAME" or args.dilation != "1":
            raise InvalidArgument("--strides, --padding and --dilation apply to --input-shape/--filter-shape")
        return None
    if len(modes) > 1:
        raise InvalidArgument(f"choose one of --input-shape/--filter-shape, --keras-model, --resnet-size; "
                              f"received {', '.join(modes)}")
    for name, value in (("--ks", args.ks), ("--rows", args.rows)):
        if value is not None:
            raise InvalidArgument(f"{name} applies to the battery; a layer's K values follow from its shape")
    if args.op != _DEFAULT_OPS:
        raise InvalidArgument("--op applies to the battery; a layer is identified for conv2d and both gradients")
    if modes[0].startswith("--input"):
        if not (args.input_shape and args.filter_shape):
            raise InvalidArgument("--input-shape and --filter-shape go together; received only "
                                  + ("--input-shape" if args.input_shape else "--filter-shape"))
        if args.batch is not None:
            raise InvalidArgument("--batch applies to --keras-model and --resnet-size; put N in --input-shape")
        padding = str(args.padding).upper()  # Layer checks it, with the shapes
        input_shape = parse_shape(args.input_shape, "--input-shape", 4)
        filter_shape = parse_shape(args.filter_shape, "--filter-shape", 4)
        assert len(input_shape) == 4 and len(filter_shape) == 4  # parse_shape(..., 4) gives exactly 4 or raises
        return [Layer(input_shape, filter_shape,
                      _pair(args.strides, "--strides"), padding, _pair(args.dilation, "--dilation"))], []
    if args.strides != "1" or args.padding != "SAME" or args.dilation != "1":
        raise InvalidArgument("--strides, --padding and --dilation apply to --input-shape; a model's layers carry their own")
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the parent builds the model: no C++ banner
    from convprobe.probes.layers import keras_layers
    from convprobe.training.config import resnet_blocks_per_stage
    from convprobe.training.model import build_resnet
    from convprobe.training.runtime import start_up_notices_dropped

    if not args.keras_model:
        resnet_blocks_per_stage(args.resnet_size)  # the one message for a bad depth
    with start_up_notices_dropped():  # TensorFlow's C++ notices print before its log level applies
        if args.keras_model:
            model = _load_keras(args.keras_model)
            return keras_layers(model, args.batch or _fixed_batch(model) or DEFAULT_BATCH)
        return keras_layers(build_resnet(args.resnet_size, image_size=args.image_size or 32),
                            args.batch or DEFAULT_BATCH)


def _fixed_batch(model) -> int | None:
    """The batch size a saved model's inputs fix (keras.Input(..., batch_size=N)), if one."""
    batches = {int(t.shape[0]) for t in getattr(model, "inputs", None) or () if t.shape and t.shape[0]}
    return batches.pop() if len(batches) == 1 else None


def _load_keras(path: str):
    """The model at `path`, every check on the file made before Keras opens it."""
    where = f"--keras-model {path!r}"
    file = check_model_file(path, where)
    import keras

    try:
        return keras.models.load_model(file, compile=False)
    except Exception as exc:  # noqa: BLE001 - any load failure is bad input, in one line
        raise InvalidArgument(f"{where} could not be loaded as a Keras model: {reason(exc)}") from None


def _with_threads(configs, threads: int | None) -> list:
    import dataclasses

    if threads is None:
        return configs
    others = sorted({c.backend for c in configs if c.backend not in ("tensorflow", "emulated")})
    if others:
        raise InvalidArgument(f"threads applies to TensorFlow's configurations only (TF_NUM_INTRAOP_THREADS); "
                              f"received --threads {threads} with --backend {','.join(others)}")
    return [dataclasses.replace(c, env={**c.env, "TF_NUM_INTRAOP_THREADS": str(threads)})
            if c.backend == "tensorflow" else c for c in configs]


def run(args) -> int:
    if args.list_configs:
        return list_configs(args.device, args.backend)
    from convprobe.emulation.composites import split_arguments
    from convprobe.identify import battery
    from convprobe.identify.layer_study import run_layer_identify
    from convprobe.identify.battery_study import run_identify

    ops = matrix_ops(args)
    specs = None
    if args.candidates is not None:
        specs = split_arguments(args.candidates)  # commas inside splitk(...) stay
        if not specs:
            raise InvalidArgument(f"--candidates must name at least one model spec; received {args.candidates!r}")
    battery.candidates(specs)  # bad specs fail before anything runs
    configs = _with_threads(matrix_configs(args), args.threads)
    chosen = layers_from_args(args)
    announce_inherited_switches(args.command)
    if chosen is not None:
        layers, not_identified = chosen
        outcome = run_layer_identify(configs, layers, specs=specs, seed=args.seed, device=args.device,
                                     timeout=args.timeout, jobs=args.jobs, not_identified=not_identified,
                                     trees=TreeRecovery(args.trees or TreeRecovery.NEEDED))
    else:
        outcome = run_identify(configs, ops, specs=specs, ks=args.ks,
                               rows=args.rows or battery.DEFAULT_ROWS, seed=args.seed, device=args.device,
                               timeout=args.timeout, jobs=args.jobs)
    emit(args, outcome)
    return 0
