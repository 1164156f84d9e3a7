"""The ResNet fp16 training harness with per-layer gradient-underflow telemetry.

Modules, one concept each (TensorFlow is imported only inside functions that
use it, after `runtime` has set the XLA flags):

- `config`: `TrainConfig`, dtype and loss-scale parsing, validation;
- `data`: synthetic data and the CIFAR-10 binary loader (NumPy);
- `runtime`: importing TensorFlow with faithful-fp16 XLA flags, logical devices;
- `model`: the CIFAR ResNet v2 with gradient taps;
- `telemetry`: classification of gradients against the fp32 shadow;
- `trainer`: the loop, loss scaling, checkpoints;
- `records`: run directory layout, streaming CSV + JSON header;
- `compare`: none / static / dynamic side by side, table and figures;
- `tensorboard`: the telemetry as TensorBoard event files;
- `callback`: `UnderflowTelemetry`, the telemetry for any Keras model's `fit`
  (imported on first use of the name: it imports Keras);
- `command`: the `convprobe train` subcommand.
"""

from convprobe.training.config import (
    DTYPES,
    LossScaleMode,
    LossScaleSpec,
    TrainConfig,
    parse_loss_scale,
    validate_config,
)
from convprobe.training.data import CifarData, SyntheticData, load_cifar10_dir, load_cifar10_file
from convprobe.training.telemetry import COUNT_FIELDS, Thresholds


def __getattr__(name):
    """`UnderflowTelemetry` subclasses a Keras callback: Keras is imported only when it is used."""
    if name == "UnderflowTelemetry":
        from convprobe.training.callback import UnderflowTelemetry

        return UnderflowTelemetry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def train(config, **kwargs):
    """Run (or resume) one training run; see `convprobe.training.trainer.train`."""
    from convprobe.training.trainer import train as _train

    return _train(config, **kwargs)


def run_comparison(config, output, **kwargs):
    """none / static / dynamic side by side; see `convprobe.training.compare`."""
    from convprobe.training.compare import run_comparison as _run

    return _run(config, output, **kwargs)


__all__ = [
    "DTYPES",
    "LossScaleMode",
    "LossScaleSpec",
    "TrainConfig",
    "parse_loss_scale",
    "validate_config",
    "CifarData",
    "SyntheticData",
    "load_cifar10_dir",
    "load_cifar10_file",
    "COUNT_FIELDS",
    "Thresholds",
    "train",
    "run_comparison",
    "UnderflowTelemetry",
]
