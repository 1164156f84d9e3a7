"""The fp16 training harness (convprobe's ResNet or your own Keras model) with per-layer
gradient-underflow telemetry, under any arithmetic.

Modules, one concept each (TensorFlow is imported only inside functions that
use it, after `runtime` has set the environment):

- `config`: `TrainConfig`, dtype and loss-scale parsing, validation;
- `data`: synthetic data, the bundled digits and the CIFAR-10 binary loader (NumPy);
- `runtime`: importing TensorFlow with faithful-fp16 XLA flags or a named configuration,
  logical devices, its start-up notices kept off stderr;
- `arithmetic`: which arithmetic each conv op computes (native, the twin, a counterfactual);
- `emulated_conv`: a conv layer's forward pass and both gradients under that arithmetic;
- `emulated_dense`: a Dense layer's matmul and both gradients under that arithmetic;
- `model`: the CIFAR ResNet v2 with gradient taps;
- `telemetry`: classification of gradients against the fp32 shadow;
- `trainer`: the ResNet's model, step, loss scaling and telemetry (`Trainer`);
- `user_trainer`: the same for a user's saved Keras model (`train --keras-model`);
- `run_loop`: one run from start or checkpoint to summary, records streamed (`train`);
- `records`: run directory layout, streaming CSV + JSON header;
- `arms`: `DTYPE[/LOSS_SCALE][@ARITHMETIC]`, one arm of a comparison;
- `compare`: every (arm, seed) in its own process, the comparison's table and figures;
- `cluster`: multi-worker training (TF_CONFIG, local rehearsal);
- `tensorboard`: the telemetry as TensorBoard event files;
- `callback`: `UnderflowTelemetry`, the telemetry for any Keras model's `fit`
  (imported on first use of the name: it imports Keras);
- `model_copies`: the callback's copies of a user's model (the fp32 shadow, a clone in the
  model's policy, a forward pass that returns watched layers' outputs);
- `model_arithmetic`: `use_arithmetic`, any Keras model's convolutions and matmuls under an
  arithmetic, the twin included (imported on first use of the name);
- `bias_fusion`: where TensorFlow adds a layer's bias (after its op, or fused in its kernel).

The `convprobe train` subcommand is `convprobe.cli.train`.
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
    """`UnderflowTelemetry` subclasses a Keras callback and `use_arithmetic` reroutes Keras
    layers: Keras and TensorFlow are imported only when one of them is used."""
    if name == "UnderflowTelemetry":
        from convprobe.training.callback import UnderflowTelemetry

        return UnderflowTelemetry
    if name == "use_arithmetic":
        from convprobe.training.model_arithmetic import use_arithmetic

        return use_arithmetic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def train(config, **kwargs):
    """Run (or resume) one training run; see `convprobe.training.run_loop.train`."""
    from convprobe.training.run_loop import train as _train

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
