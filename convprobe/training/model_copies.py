"""Copies of a user's Keras model for `UnderflowTelemetry`: the fp32 shadow, the clone in the
model's own policy for a custom step, and a forward pass that also returns watched layers'
outputs. A functional or Sequential model is cloned layer by layer; a subclassed one is
rebuilt from its config and refused in one line where that cannot give the same weights."""

from __future__ import annotations

import keras
from keras.src import tree

from convprobe.errors import InvalidArgument

__all__ = ["functional", "copy_model", "forward_with_taps", "one_output", "single_output"]


def functional(model) -> bool:
    """Whether `model` is a graph of layers (functional or Sequential): it has symbolic inputs."""
    try:
        return bool(model.inputs)
    except (AttributeError, ValueError):
        return False


def copy_model(model, dtype):
    """A copy of `model` with fresh weights; `dtype` None keeps each layer's policy. A functional
    or Sequential model is cloned layer by layer; a subclassed one is rebuilt from its config."""
    if not functional(model):
        return _rebuild(model, dtype)

    def clone_layer(layer):
        config = layer.get_config()
        if dtype is not None:
            config["dtype"] = dtype
        return layer.__class__.from_config(config)

    return keras.models.clone_model(model, clone_function=clone_layer)


def _rebuild(model, dtype):
    """A subclassed `model` made again as `type(model).from_config(model.get_config())`, its layers
    created under `dtype` (None: the model's policy) and built by one call on symbolic inputs of
    the shapes it was built with; refused in one line when that cannot give the same weights."""
    name = type(model).__name__
    if model.get_build_config() is None or not model.weights:  # fit builds it only in its first step
        raise InvalidArgument(f"a subclassed model must be built before fit, by calling it on a batch (its fp32 "
                              f"shadow is built on the same input shapes); received a {name} without weights")
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(model.dtype_policy if dtype is None else dtype)
    try:  # the user's get_config, from_config and call: whatever they raise means "not rebuildable"
        config = model.get_config()
        if dtype is not None and "dtype" in config:
            config["dtype"] = dtype
        clone = type(model).from_config(config)
        clone(tree.map_shape_structure(keras.KerasTensor, model.get_build_config()["input_shape"]))
    except Exception as error:  # noqa: BLE001 - reported, with its type and first paragraph
        reason = " ".join(str(error).strip().split("\n\n")[0].split())  # its first paragraph
        raise InvalidArgument(
            f"a subclassed model must be rebuildable as type(model).from_config(model.get_config()) "
            f"for the fp32 shadow (define get_config and from_config); received a {name} whose rebuild "
            f"raised {type(error).__name__}: {reason}") from error
    finally:
        keras.mixed_precision.set_global_policy(previous)
    if [tuple(w.shape) for w in clone.weights] != [tuple(w.shape) for w in model.weights]:
        raise InvalidArgument(f"a subclassed model rebuilt from its config must have the model's weights "
                              f"(define get_config and from_config); received a {name} rebuilt with "
                              f"{len(clone.weights)} weights for its {len(model.weights)}")
    other = [layer.name for layer in clone._flatten_layers() if dtype is not None and layer.compute_dtype != dtype]
    if other:
        raise InvalidArgument(f"a subclassed model's layers must take their dtype from the global policy "
                              f"(the shadow is rebuilt under {dtype}); received a {name} whose layer "
                              f"{other[0]!r} computes in another dtype")
    return clone


def forward_with_taps(model, tap_names):
    """`(x, training) -> (predictions, tapped outputs)` over `model`: a functional model with the
    named layers' outputs among its outputs; a subclassed model itself and no taps (its layers'
    outputs are no symbolic tensors a model could return)."""
    if not functional(model):
        return lambda x, training: (model(x, training=training), [])
    n = len(model.outputs)
    taps = keras.Model(model.inputs, list(model.outputs) + [model.get_layer(t).output for t in tap_names])

    def forward(x, training):
        outs = taps(x, training=training)
        return (outs[0] if n == 1 else list(outs[:n])), list(outs[n:])

    return forward


def one_output(model) -> bool:
    """Whether `model`'s predictions are one tensor the taps can sit beside (a subclassed model's
    are whatever its call returns, and it has no taps)."""
    return not functional(model) or len(model.outputs) == 1


def single_output(layer) -> bool:
    """Whether a layer has one symbolic output (its gradient can be tapped)."""
    try:
        output = layer.output
    except (AttributeError, ValueError):
        return False
    return not isinstance(output, (list, tuple, dict))
