"""CIFAR ResNet v2 (pre-activation, depth 6n+2) on Keras 3, with gradient taps.

He et al., "Identity Mappings in Deep Residual Networks" (2016), CIFAR variant
as in the reference ResNet (tensorflow/models official/resnet): a 3x3 conv to
16 channels, three stages of n pre-activation blocks (16, 32, 64 filters,
strides 1, 2, 2; a 1x1 projection shortcut where the shape changes), then
BN-ReLU, global average pooling and a dense layer. NHWC.

The compute dtype comes from a Keras dtype policy (`mixed_float16`,
`mixed_bfloat16` or `float32`): variables stay fp32 and are cast to the
compute dtype on use, which is what the reference ResNet's custom getter did
by hand. Logits are cast to fp32 before the softmax.

The model returns the logits *and* every layer's output ("taps"), so one
`tape.gradient` call yields both the weight gradients and the activation
gradients (dLoss/d output of each layer) that the telemetry inspects. Layer
names are fixed, so an fp32 shadow built by the same function lines up layer
by layer and weight by weight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from convprobe.training.arithmetic import ConvShape
from convprobe.training.config import resnet_blocks_per_stage

__all__ = ["POLICIES", "build_resnet", "conv_shapes", "route_convolutions"]

#: Keras dtype policy per compute format (variables are fp32 in all three).
POLICIES = {"fp16": "mixed_float16", "bf16": "mixed_bfloat16", "fp32": "float32"}


def build_resnet(resnet_size: int = 20, *, image_size: int = 32, num_classes: int = 10,
                 dtype: str = "fp16", seed: int = 0, bn_momentum: float = 0.997):
    """A Keras functional ResNet whose outputs are `[logits_fp32, *taps]`.

    `model.tap_names` lists the layer names of the taps in order;
    `model.tap_same_gradient` maps a tap index to an earlier tap whose gradient
    is the same tensor (a block's output and its conv2 output: the Add passes
    the gradient through unchanged), so telemetry can measure it once. Weights are
    initialised from `seed`, so two calls with the same seed give the same
    initial weights whatever the dtype. `bn_momentum` 0.997 is the reference
    ResNet's (made for ~10^5 steps); short runs need a smaller one (e.g. 0.9) for
    the moving statistics, hence evaluation, to mean anything.
    """
    import keras
    from keras import layers

    n = resnet_blocks_per_stage(resnet_size)
    policy = keras.DTypePolicy(POLICIES[dtype])
    taps: list = []
    same_gradient: dict[int, int] = {}

    def init(k: int):
        return keras.initializers.HeNormal(seed=seed * 1000 + k)

    counter = iter(range(10_000))

    def conv(x, filters, kernel, strides, name):
        y = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                          kernel_initializer=init(next(counter)), dtype=policy, name=name)(x)
        taps.append(y)
        return y

    def bn_relu(x, name):
        y = layers.BatchNormalization(momentum=bn_momentum, epsilon=1e-5, dtype=policy, name=f"{name}_bn")(x)
        taps.append(y)
        y = layers.ReLU(dtype=policy, name=f"{name}_relu")(y)
        taps.append(y)
        return y

    inputs = keras.Input((image_size, image_size, 3), name="images")
    x = conv(inputs, 16, 3, 1, "initial_conv")
    for stage, filters in enumerate((16, 32, 64), start=1):
        for block in range(1, n + 1):
            prefix = f"stage{stage}_block{block}"
            strides = 2 if (stage > 1 and block == 1) else 1
            pre = bn_relu(x, f"{prefix}_pre")
            if strides != 1 or x.shape[-1] != filters:
                shortcut = conv(pre, filters, 1, strides, f"{prefix}_projection")
            else:
                shortcut = x
            y = conv(pre, filters, 3, strides, f"{prefix}_conv1")
            y = bn_relu(y, f"{prefix}_mid")
            y = conv(y, filters, 3, 1, f"{prefix}_conv2")
            x = layers.Add(dtype=policy, name=f"{prefix}_add")([y, shortcut])
            taps.append(x)
            # conv2's output feeds only this Add, whose gradient passes through unchanged.
            same_gradient[len(taps) - 1] = len(taps) - 2
    x = bn_relu(x, "final")
    x = layers.GlobalAveragePooling2D(dtype=policy, name="pool")(x)
    taps.append(x)
    x = layers.Dense(num_classes, kernel_initializer=keras.initializers.GlorotUniform(seed=seed * 1000 + 999),
                     dtype=policy, name="dense")(x)
    taps.append(x)
    logits = layers.Activation("linear", dtype="float32", name="logits_fp32")(x)
    model = keras.Model(inputs, [logits, *taps], name=f"resnet{resnet_size}_{dtype}")
    model.tap_names = [t._keras_history.operation.name for t in taps]
    model.tap_same_gradient = same_gradient
    return model


def conv_shapes(model, batch: int) -> dict[str, ConvShape]:
    """Each Conv2D layer of `model` (in order) as identify keys it, at this batch size."""
    import keras

    out = {}
    for layer in model.layers:
        if type(layer) is keras.layers.Conv2D:
            _, h, w, c = layer.input.shape
            out[layer.name] = ConvShape((batch, h, w, c), tuple(layer.kernel.shape), tuple(layer.strides),
                                        layer.padding.upper(), tuple(layer.dilation_rate))
    return out


def route_convolutions(model, convolutions: Mapping[str, Callable]) -> None:
    """Compute the named conv layers' convolutions with the given functions of (inputs,
    kernel): a Keras Conv2D's call computes `self.convolution_op(inputs, kernel)`, so the
    layer keeps its weights, its dtype policy and everything around the convolution."""
    for name, convolution in convolutions.items():
        model.get_layer(name).convolution_op = convolution
