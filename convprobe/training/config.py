"""The training run's configuration, validated once at the boundary.

Everything a run needs is in one frozen `TrainConfig`. `validate_config` turns
user input into it and raises `InvalidArgument` (one line naming the argument,
the value and what is allowed) for anything out of range. No TensorFlow here.

The dtype/loss-scale rules follow the reference ResNet's fp16 support
(tensorflow/models PR #3687): a `dtype` flag rather than an fp16 switch, a loss
scale that defaults per format (fp16 -> 128, otherwise 1) and invalid dtypes
rejected with a clear error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from convprobe.backends.configurations import MATRIX
from convprobe.errors import InvalidArgument, invalid_choice, is_integer
from convprobe.files import check_directory_path, check_input_file, check_model_file, file_sha256
from convprobe.formats import FP32, Format, parse_format
from convprobe.options import ComputeDtype, LossScaleMode
from convprobe.provenance import memory_limit
from convprobe.training.arithmetic import Arithmetic, ArithmeticKind, read_identify_map
from convprobe.training.data import CIFAR_IMAGE_SIZE, DIGITS_IMAGE_SIZE

__all__ = [
    "DTYPES",
    "LossScaleMode",
    "LossScaleSpec",
    "TrainConfig",
    "parse_loss_scale",
    "validate_config",
    "resnet_blocks_per_stage",
]

#: The compute dtypes the trainer accepts (variables are always fp32).
DTYPES = tuple(ComputeDtype)  # the harness's compute dtypes, in this order
DATA_SOURCES = ("synthetic", "cifar10", "digits")
#: Each data source's image side when --image-size is not given; cifar10 and digits have only theirs.
IMAGE_SIZES = {"synthetic": 32, "cifar10": CIFAR_IMAGE_SIZE, "digits": DIGITS_IMAGE_SIZE}
DISTRIBUTE = ("none", "mirrored", "multi-worker")


@dataclass(frozen=True)
class LossScaleSpec:
    """A loss-scaling mode and its (initial) scale."""

    mode: LossScaleMode
    scale: float

    @property
    def label(self) -> str:
        """Short name used for run directories and table columns."""
        if self.mode is LossScaleMode.STATIC:
            return f"static-{_number(self.scale)}"
        if self.mode is LossScaleMode.STATIC_NO_SKIP:
            return f"static-{_number(self.scale)}-noskip"
        return self.mode.value


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


#: The smallest static loss scale: fp32's smallest normal number (a smaller S would lose bits
#: of the fp32 loss it multiplies before any low-precision arithmetic starts).
MIN_LOSS_SCALE = 2.0**-126
LOSS_SCALE_ALLOWED = (f"none, dynamic or a positive number from 2**-126 to {FP32.max:.6g} (fp32's normal range, "
                      f"where the scaled loss is computed)")

#: The largest seed: NumPy's legacy RandomState and Python's `random` seeded by Keras take
#: seeds below 2**32.
MAX_SEED = 2**32 - 1


def parse_loss_scale(
    value: str | float | None, fmt: Format, *, skip: bool = True,
    dynamic_initial: float = 2.0**15,
) -> LossScaleSpec:
    """`none`, `dynamic`, a positive number, or None (the format's default).

    The default is the format's `default_loss_scale` (128 for fp16, 1 otherwise,
    as in the reference ResNet); a default of 1 means no scaling.
    """
    if value is None:
        value = fmt.default_loss_scale
        if value == 1:
            return LossScaleSpec(LossScaleMode.NONE, 1.0)
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "none":
            return LossScaleSpec(LossScaleMode.NONE, 1.0)
        if text == "dynamic":
            return LossScaleSpec(LossScaleMode.DYNAMIC, float(dynamic_initial))
        try:
            number = float(text)
        except ValueError:
            raise InvalidArgument(f"--loss-scale must be {LOSS_SCALE_ALLOWED}; received {value!r}") from None
    else:
        number = float(value)
    if not math.isfinite(number) or not MIN_LOSS_SCALE <= number <= FP32.max:
        raise InvalidArgument(f"--loss-scale must be {LOSS_SCALE_ALLOWED}; received {value!r}")
    mode = LossScaleMode.STATIC if skip else LossScaleMode.STATIC_NO_SKIP
    return LossScaleSpec(mode, number)


#: The deepest ResNet the builder makes: Keras 3.15 maps a functional graph recursively, and at
#: depth 296 that recursion passes Python's default limit (measured: 272 builds, 296 raises
#: RecursionError after seconds of work), so deeper requests are refused before any work.
MAX_RESNET_SIZE = 272


def resnet_blocks_per_stage(resnet_size: int) -> int:
    """n for a CIFAR ResNet of depth 6n+2 (He et al. 2016): 20 -> 3, 32 -> 5, 56 -> 9."""
    if not is_integer(resnet_size) or not 8 <= resnet_size <= MAX_RESNET_SIZE or (resnet_size - 2) % 6:
        raise InvalidArgument(
            f"--resnet-size must be 6n+2 from 8 to {MAX_RESNET_SIZE} (8, 14, 20, 32, 44, 56, 110, ...); "
            f"received {resnet_size!r}"
        )
    return (resnet_size - 2) // 6


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Build it with `validate_config`."""

    dtype: str = "fp16"
    loss_scale: LossScaleSpec = field(default_factory=lambda: LossScaleSpec(LossScaleMode.STATIC, 128.0))
    steps: int = 100
    record_every: int = 10
    batch_size: int = 128
    #: the ResNet's depth and image side (None for a user's model, whose shapes are its own)
    resnet_size: int | None = 20
    image_size: int | None = 32
    seed: int = 0
    #: a data source (synthetic, cifar10, digits), or a user's .npz file with keras_model
    data: str = "synthetic"
    data_dir: str | None = None
    output: str | None = None
    jit: bool = True
    distribute: str = "none"
    logical_devices: int = 2
    #: the ResNet's SGD (None for a user's model, which trains with its own optimizer)
    learning_rate: float | None = 0.1
    momentum: float | None = 0.9
    weight_decay: float | None = 2e-4
    dynamic_growth_steps: int = 2000
    checkpoint_every: int = 50
    eval_batches: int = 0
    synthetic_noise: float = 1.0
    bn_momentum: float | None = 0.997
    progress: bool = False
    #: native, twin, or a model spec / GPU preset, parsed once (`validate_config`)
    arithmetic: Arithmetic = field(default_factory=lambda: Arithmetic.parse(ArithmeticKind.NATIVE))
    #: the twin's identify map (None: measured on the fly into the run directory)
    arithmetic_map: str | None = None
    #: TensorFlow configuration by its matrix name (None: the environment as it is)
    configuration: str | None = None
    #: a user's saved, compiled Keras model trained instead of the ResNet (an absolute path),
    #: and the SHA-256 of its file and of the data file (a resumed run must find the same)
    keras_model: str | None = None
    keras_model_sha256: str | None = None
    data_sha256: str | None = None

    @property
    def format(self) -> Format:
        return parse_format(self.dtype, argument="dtype", allowed=DTYPES)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["arithmetic"] = self.arithmetic.text
        d["loss_scale"] = {"mode": self.loss_scale.mode.value, "scale": self.loss_scale.scale,
                           "label": self.loss_scale.label}
        return d


#: Configuration fields whose command-line flag is not the field's name.
_FLAGS = {"logical_devices": "--devices"}


def _positive_int(name: str, value: object, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or (
            high is not None and value > high):
        allowed = "a positive integer" if high is None else f"an integer from 1 to {high}"
        raise InvalidArgument(f"{_FLAGS.get(name, '--' + name.replace('_', '-'))} must be {allowed}; "
                              f"received {value!r}")
    return value


#: Upper bounds of the size options: far above any run this harness is for, low enough that a
#: typo is caught before TensorFlow allocates.
LIMITS = {"steps": 10**9, "record_every": 10**9, "batch_size": 65536, "image_size": 1024,
          "checkpoint_every": 10**9, "logical_devices": 64, "dynamic_growth_steps": 10**9}


def memory_estimate(batch_size: int, image_size: int, resnet_size: int) -> int:
    """Rough bytes of one training step: per image, every conv layer's output (16 channels
    at full resolution or the same volume later) in fp16, its fp32 shadow and both their
    gradients (2 + 4 bytes, twice), plus the fp32 input."""
    layers = resnet_size
    return batch_size * image_size * image_size * (12 + layers * 16 * 12)



#: The ResNet's options and their defaults: a user's model (keras_model) takes none of them.
RESNET_DEFAULTS = {"resnet_size": 20, "learning_rate": 0.1, "momentum": 0.9, "weight_decay": 2e-4,
                   "bn_momentum": 0.997}


def validate_config(
    *, dtype: str = "fp16", loss_scale: str | float | None = None, skip: bool = True,
    steps: int = 100, record_every: int = 10, batch_size: int = 128, resnet_size: int | None = None,
    image_size: int | None = None, seed: int = 0, data: str = "synthetic", data_dir: str | None = None,
    output: str | None = None, jit: bool | None = None, distribute: str = "none",
    logical_devices: int = 2, learning_rate: float | None = None, checkpoint_every: int = 50,
    eval_batches: int = 0, dynamic_growth_steps: int = 2000, synthetic_noise: float = 1.0,
    progress: bool = False, weight_decay: float | None = None, momentum: float | None = None,
    bn_momentum: float | None = None, arithmetic: str | Arithmetic = "native", arithmetic_map: str | None = None,
    configuration: str | None = None, keras_model: str | None = None,
) -> TrainConfig:
    """Check every user-facing value and return the run's `TrainConfig`. `jit` None
    chooses: the configuration's, off under an emulated arithmetic, on otherwise. `image_size`
    None is the data source's (`IMAGE_SIZES`); the ResNet's options None are their defaults
    (`RESNET_DEFAULTS`). With `keras_model` (the user's saved model) `data` is its .npz file
    and the ResNet's options are refused."""
    fmt = parse_format(dtype, argument="--dtype", allowed=DTYPES)
    resnet = {"resnet_size": resnet_size, "learning_rate": learning_rate, "momentum": momentum,
              "weight_decay": weight_decay, "bn_momentum": bn_momentum}
    if keras_model is not None:
        if synthetic_noise != 1.0:
            raise InvalidArgument("synthetic_noise applies to the ResNet's synthetic data; --keras-model trains on "
                                  "your data")
        return _user_model_config(keras_model, data, data_dir, image_size, distribute, resnet, replace_args=dict(
            dtype=dtype, loss_scale=loss_scale, skip=skip, steps=steps, record_every=record_every,
            batch_size=batch_size, seed=seed, output=output, jit=jit, logical_devices=logical_devices,
            checkpoint_every=checkpoint_every, eval_batches=eval_batches,
            dynamic_growth_steps=dynamic_growth_steps, progress=progress, arithmetic=arithmetic,
            arithmetic_map=arithmetic_map, configuration=configuration))
    resnet_size = int(RESNET_DEFAULTS["resnet_size"]) if resnet_size is None else resnet_size
    learning_rate = RESNET_DEFAULTS["learning_rate"] if learning_rate is None else learning_rate
    momentum = RESNET_DEFAULTS["momentum"] if momentum is None else momentum
    weight_decay = RESNET_DEFAULTS["weight_decay"] if weight_decay is None else weight_decay
    bn_momentum = RESNET_DEFAULTS["bn_momentum"] if bn_momentum is None else bn_momentum
    if data not in DATA_SOURCES:
        if str(data).endswith(".npz"):
            raise InvalidArgument(f"--data {data} is a user's data file: it trains a user's model "
                                  f"(--keras-model M.keras); the ResNet's data sources are "
                                  f"{', '.join(DATA_SOURCES)}")
        raise invalid_choice("--data", data, DATA_SOURCES)
    if image_size is None:
        image_size = IMAGE_SIZES[data]
    spec = parse_loss_scale(loss_scale, fmt, skip=skip)
    for name, value in (("steps", steps), ("record_every", record_every),
                        ("batch_size", batch_size), ("image_size", image_size),
                        ("checkpoint_every", checkpoint_every),
                        ("logical_devices", logical_devices),
                        ("dynamic_growth_steps", dynamic_growth_steps)):
        _positive_int(name, value, LIMITS[name])
    resnet_blocks_per_stage(resnet_size)
    need, limit = memory_estimate(batch_size, image_size, resnet_size), memory_limit()
    if need > limit:
        raise InvalidArgument(f"--batch-size {batch_size} at --image-size {image_size} with ResNet-{resnet_size} "
                              f"needs about {need / 2**30:.1f} GiB; at most {limit / 2**30:.1f} GiB (half this "
                              f"machine's memory) is allowed: use a smaller batch or image")
    if not is_integer(seed) or not 0 <= seed <= MAX_SEED:
        raise InvalidArgument(f"--seed must be an integer from 0 to 2**32 - 1; received {seed!r}")
    if isinstance(eval_batches, bool) or not isinstance(eval_batches, int) or eval_batches < 0:
        raise InvalidArgument(f"--eval-batches must be a non-negative integer; received {eval_batches!r}")
    if data == "cifar10" and not data_dir:
        raise InvalidArgument("--data-dir must name a directory of CIFAR-10 .bin files when --data is cifar10; received None")
    if data != "cifar10" and data_dir is not None:
        raise InvalidArgument(f"--data-dir is read only with --data cifar10; received --data-dir {data_dir!r} with "
                              f"--data {data}")
    if data in ("cifar10", "digits") and image_size != IMAGE_SIZES[data]:
        side = IMAGE_SIZES[data]
        raise InvalidArgument(f"--image-size must be {side} with --data {data} (its images are {side}x{side}; "
                              f"leave --image-size out); received {image_size}")
    if output is not None:
        check_directory_path(output)
    if distribute not in DISTRIBUTE:
        raise invalid_choice("--distribute", distribute, DISTRIBUTE)
    if distribute == "mirrored" and batch_size % logical_devices:
        raise InvalidArgument(
            f"--batch-size must be a multiple of --devices ({logical_devices}) under --distribute mirrored; "
            f"received {batch_size!r}"
        )
    for name, number in (("learning_rate", learning_rate), ("synthetic_noise", synthetic_noise)):
        if not (isinstance(number, (int, float)) and math.isfinite(number) and number > 0):
            flag = "--learning-rate" if name == "learning_rate" else name  # synthetic_noise: API only
            raise InvalidArgument(f"{flag} must be a positive number; received {number!r}")
    for name, number in (("weight_decay", weight_decay), ("momentum", momentum)):
        if not (isinstance(number, (int, float)) and math.isfinite(number) and number >= 0):
            raise InvalidArgument(f"{name} must be a non-negative number; received {number!r}")
    if not (isinstance(bn_momentum, (int, float)) and 0 <= bn_momentum < 1):
        raise InvalidArgument(f"--bn-momentum must be a number in [0, 1); received {bn_momentum!r}")
    chosen = arithmetic if isinstance(arithmetic, Arithmetic) else Arithmetic.parse(arithmetic)
    jit = _check_arithmetic(chosen, arithmetic_map, configuration, jit, fmt, distribute)
    return TrainConfig(
        arithmetic=chosen, arithmetic_map=arithmetic_map, configuration=configuration,
        dtype=fmt.name, bn_momentum=float(bn_momentum), loss_scale=spec, steps=steps, record_every=record_every,
        batch_size=batch_size, resnet_size=resnet_size, image_size=image_size, seed=seed,
        data=data, data_dir=data_dir, output=output, jit=bool(jit), distribute=distribute,
        logical_devices=logical_devices, learning_rate=float(learning_rate),
        checkpoint_every=checkpoint_every, eval_batches=eval_batches,
        dynamic_growth_steps=dynamic_growth_steps, synthetic_noise=float(synthetic_noise),
        progress=progress, weight_decay=float(weight_decay), momentum=float(momentum),
    )


def _user_model_config(keras_model: str, data: str, data_dir: str | None, image_size: int | None,
                       distribute: str, resnet: dict, replace_args: dict) -> TrainConfig:
    """The run's configuration for a user's model: the files checked and fingerprinted, every
    other value checked as the ResNet's are (the model and data themselves are checked
    against each other when TensorFlow starts, before any step: `user_trainer`)."""
    given = [name for name, value in resnet.items() if value is not None]
    if given or image_size is not None or data_dir is not None:
        name = given[0] if given else "image_size" if image_size is not None else "data_dir"
        raise InvalidArgument(f"--{name.replace('_', '-')} applies to the ResNet; --keras-model trains your model with "
                              f"its own shapes and its compiled optimizer")
    if distribute != "none":
        raise InvalidArgument(f"--keras-model trains in one process on one device; received --distribute "
                              f"{distribute}")
    model = check_model_file(keras_model, f"--keras-model {keras_model!r}")
    if not data:
        raise InvalidArgument("--keras-model trains on your data: give --data D.npz (x_train, y_train, optionally "
                              "x_test, y_test)")
    if data in DATA_SOURCES or not str(data).endswith(".npz"):
        raise InvalidArgument(f"--data must be your .npz file (x_train, y_train, optionally x_test, y_test) with "
                              f"--keras-model; received --data {data}")
    arrays = check_input_file(data, f"--data {data!r}")
    # every other value checked once, as the smallest ResNet's (its memory estimate bounds a batch's)
    base = validate_config(**replace_args, data="synthetic", image_size=8, resnet_size=8)
    return replace(base, keras_model=str(Path(model).resolve()), keras_model_sha256=file_sha256(model),
                   data=str(Path(arrays).resolve()), data_sha256=file_sha256(arrays), resnet_size=None,
                   image_size=None, learning_rate=None, momentum=None, weight_decay=None, bn_momentum=None)


def _check_arithmetic(chosen: Arithmetic, arithmetic_map: str | None, configuration: str | None,
                      jit: bool | None, fmt: Format, distribute: str) -> bool:
    """The rules of --arithmetic, --arithmetic-map and --config; returns the run's jit."""
    if configuration is not None and configuration not in MATRIX["cpu"]:
        raise invalid_choice("--config", configuration, tuple(MATRIX["cpu"]))
    config_jit = None if configuration is None else MATRIX["cpu"][configuration][1]
    if config_jit is not None and jit is not None and bool(jit) != config_jit:
        raise InvalidArgument(f"--config {configuration} runs {'with' if config_jit else 'without'} XLA; "
                              f"received {'--jit' if jit else '--no-jit'}")
    if arithmetic_map is not None:
        if chosen.kind is not ArithmeticKind.TWIN:
            raise InvalidArgument(f"--arithmetic-map is read only with --arithmetic twin; received "
                                  f"--arithmetic {chosen.text}")
        read_identify_map(arithmetic_map)  # a missing or foreign file fails here, before TensorFlow
    if not chosen.emulated:
        return bool(True if jit is None and config_jit is None else (config_jit if jit is None else jit))
    if fmt.name != "fp16":
        raise InvalidArgument(f"--arithmetic {chosen.text} emulates fp16 convolutions; it applies to --dtype "
                              f"fp16; received --dtype {fmt.name}")
    if distribute != "none":
        raise InvalidArgument(f"--arithmetic {chosen.text} runs in one process on one device; received "
                              f"--distribute {distribute}")
    if jit or config_jit:
        raise InvalidArgument(f"--arithmetic {chosen.text} computes the convolutions in the emulator, which XLA "
                              f"cannot compile: use --no-jit and a configuration without jit; received "
                              f"{'--config ' + str(configuration) if config_jit else '--jit'}")
    return False
