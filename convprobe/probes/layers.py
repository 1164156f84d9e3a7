"""A user's conv layer as a probe target: its shape, its three ops, their inputs.

TensorFlow's kernels change arithmetic with shape (blocking, threads, the micro
kernel picked for few channels), so `identify` can run at the layer a user really
has: ``--input-shape N,H,W,C --filter-shape KH,KW,CIN,COUT`` plus strides,
padding and dilation, or every distinct conv layer of a Keras model. Each layer
gives three ops - the forward conv and both gradients - each a reduction of its
own length K (`Layer.k`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from convprobe.emulation.conv import resolve_padding
from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.options import comma_integers

__all__ = ["LAYER_OPS", "DEPTHWISE_OPS", "MATMUL_OPS", "OP_SEEDS", "TRANSPOSED_SUFFIX", "LayerKind", "PADDINGS", "MAX_LAYER_ELEMENTS", "Layer", "parse_shape", "op_shapes", "op_result_shape", "op_inputs",
           "op_confirmation_inputs", "op_zero_sign_inputs", "CONFIRMATION_MIX", "op_call", "run_op",
           "run_ops",
           "keras_layers", "NotIdentified"]

#: The ops of one conv layer, forward then the two gradients.
LAYER_OPS = ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter")
#: The ops of one depthwise layer (TensorFlow's DepthwiseConv2dNative and its two gradients).
DEPTHWISE_OPS = ("depthwise_conv2d", "depthwise_conv2d_backprop_input", "depthwise_conv2d_backprop_filter")
#: The ops of one Dense layer: its matmul ``x @ W`` and the two TensorFlow's registered gradient
#: runs, ``dy @ W.T`` and ``x.T @ dy`` (MatMul with transpose_b, then with transpose_a).
MATMUL_OPS = ("matmul", "matmul_input_gradient", "matmul_kernel_gradient")
#: Marks a Conv2DTranspose measured as the conv2d it transposes: its forward is that conv2d's
#: conv2d_backprop_input, its input gradient the conv2d, its filter gradient conv2d_backprop_filter.
TRANSPOSED_SUFFIX = " (transposed)"
#: Each op's seed stream, keyed by name: adding an op changes no other op's inputs.
OP_SEEDS = {"conv2d": 0, "conv2d_backprop_input": 1, "conv2d_backprop_filter": 2,
            "depthwise_conv2d": 3, "depthwise_conv2d_backprop_input": 4, "depthwise_conv2d_backprop_filter": 5}


class LayerKind(StrEnum):
    """What a layer computes: a dense conv2d (HWIO filter), a depthwise one whose filter is
    (KH, KW, C, multiplier) and whose output channel c * multiplier + m sums channel c alone,
    or a Dense layer's matmul, shaped as the 1x1 conv2d it equals: input (rows, 1, 1, K),
    filter (1, 1, K, units)."""

    CONV2D = "conv2d"
    DEPTHWISE = "depthwise"
    MATMUL = "matmul"
PADDINGS = ("SAME", "VALID")
#: Largest tensor a layer may have (elements): the emulator holds im2col copies of it.
MAX_LAYER_ELEMENTS = 2**24


def parse_shape(text: str, argument: str, length: int) -> tuple[int, ...]:
    """'8,32,32,16' -> (8, 32, 32, 16): exactly `length` positive integers."""
    values = comma_integers(text) or ()
    if len(values) != length or min(values) < 1:
        raise InvalidArgument(f"{argument} must be {length} comma-separated positive integers; received {text!r}")
    return values


def _out(size: int, k: int, stride: int, dilation: int, padding: str) -> int:
    span = (k - 1) * dilation + 1
    return -(-size // stride) if padding == "SAME" else (size - span) // stride + 1


@dataclass(frozen=True)
class Layer:
    """One conv2d layer: NHWC input, HWIO filter (I = C / groups), strides, padding, dilation."""

    input_shape: tuple[int, int, int, int]
    filter_shape: tuple[int, int, int, int]
    strides: tuple[int, int] = (1, 1)
    padding: str = "SAME"
    dilation: tuple[int, int] = (1, 1)
    #: Where the layer comes from (a Keras layer's name), for tables.
    name: str = field(default="", compare=False)
    kind: LayerKind = LayerKind.CONV2D

    def __post_init__(self):
        n, h, w, c = self.input_shape
        kh, kw, cin, cout = self.filter_shape
        object.__setattr__(self, "kind", LayerKind(self.kind))
        if self.padding not in PADDINGS:
            raise invalid_choice("padding", self.padding, PADDINGS)
        if min(*self.strides, *self.dilation) < 1:
            raise InvalidArgument(f"strides and dilation must be positive; received {self.strides}, {self.dilation}")
        if self.kind is LayerKind.MATMUL and ((h, w, kh, kw, cin) != (1, 1, 1, 1, c) or self.strides != (1, 1)
                                              or self.dilation != (1, 1) or self.padding != "VALID"):
            raise InvalidArgument(f"a matmul layer is the 1x1 conv2d of input (rows, 1, 1, K) and filter "
                                  f"(1, 1, K, units), stride 1, VALID; received {self.input_shape} * {self.filter_shape}")
        if self.kind is LayerKind.DEPTHWISE and cin != c:
            raise InvalidArgument(f"filter-shape input channels ({cin}) must equal input-shape channels ({c})")
        if c % cin or cout % (c // cin):
            raise InvalidArgument(f"filter-shape input channels ({cin}) must equal input-shape channels ({c}), or "
                                  f"divide them into groups that also divide the output channels ({cout})")
        cout = self.output_shape[3]
        if min(self.output_shape) < 1:
            raise InvalidArgument(f"input {h}x{w} is too small for a {kh}x{kw} filter with dilation "
                                  f"{self.dilation} and padding {self.padding}")
        if max(self.strides) > 1 and max(self.dilation) > 1:
            raise InvalidArgument(f"strides {self.strides} and dilation {self.dilation}: TensorFlow's conv2d "
                                  f"takes strides > 1 or dilation > 1, not both")
        sizes = {"input": math.prod(self.input_shape), "output": math.prod(self.output_shape),
                 "forward im2col": math.prod(self.output_shape[:3]) * kh * kw * c,
                 "input-gradient im2col": n * h * w * kh * kw * cout}
        for what, size in sizes.items():
            if size > MAX_LAYER_ELEMENTS:
                raise InvalidArgument(f"the layer's {what} has {size} elements; at most {MAX_LAYER_ELEMENTS} "
                                      f"are allowed (use a smaller batch or image)")

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        n, h, w, _ = self.input_shape
        kh, kw, cin, cout = self.filter_shape
        channels = cin * cout if self.kind is LayerKind.DEPTHWISE else cout  # depthwise: C x multiplier
        return (n, _out(h, kh, self.strides[0], self.dilation[0], self.padding),
                _out(w, kw, self.strides[1], self.dilation[1], self.padding), channels)

    @property
    def groups(self) -> int:
        """A conv2d's groups (input channels over the filter's): each output channel sums the
        input channels of its own group (Keras's Conv2D(groups=...)); 1 for a depthwise layer,
        whose kind says it sums one channel."""
        return 1 if self.kind is LayerKind.DEPTHWISE else self.input_shape[3] // self.filter_shape[2]

    def one_group(self) -> Layer:
        """The conv2d of one group: where a grouped layer's structure is measured."""
        n, h, w, _ = self.input_shape
        kh, kw, cin, cout = self.filter_shape
        return Layer((n, h, w, cin), (kh, kw, cin, cout // self.groups), self.strides, self.padding, self.dilation,
                     self.name)

    @property
    def ops(self) -> tuple[str, str, str]:
        """The forward op and its two gradients, as the backends name them."""
        return {LayerKind.CONV2D: LAYER_OPS, LayerKind.DEPTHWISE: DEPTHWISE_OPS,
                LayerKind.MATMUL: MATMUL_OPS}[self.kind]

    @property
    def pads(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The resolved padding: ((top, bottom), (left, right))."""
        return resolve_padding(self.padding, self.input_shape[1:3], self.filter_shape[:2], self.strides,
                               self.dilation)

    @property
    def dimensions(self) -> tuple[tuple[int, int, int, int, int, int], ...]:
        """Per spatial dimension (height, width): (input size, taps, outputs, stride, dilation,
        padding before)."""
        return tuple(zip(self.input_shape[1:3], self.filter_shape[:2], self.output_shape[1:3], self.strides,
                         self.dilation, (top for top, _ in self.pads)))

    def k(self, op: str) -> int:
        """Length of the reduction behind each output of `op`."""
        kh, kw, cin, cout = self.filter_shape
        n, oh, ow, _ = self.output_shape
        if self.kind is LayerKind.DEPTHWISE:  # one channel's taps (times the multiplier going back)
            return dict(zip(DEPTHWISE_OPS, (kh * kw, kh * kw * cout, n * oh * ow)))[op]
        op = dict(zip(MATMUL_OPS, LAYER_OPS)).get(op, op)  # a matmul's are its 1x1 conv2d's
        return {"conv2d": kh * kw * cin, "conv2d_backprop_input": kh * kw * cout // self.groups,
                "conv2d_backprop_filter": n * oh * ow}[op]

    @property
    def label(self) -> str:
        """'8x32x32x16 * 3x3x16x16 s1 SAME' (plus dilation when not 1); 'matmul 8x64 @ 64x10'."""
        if self.kind is LayerKind.MATMUL:
            return f"matmul {self.input_shape[0]}x{self.input_shape[3]} @ {self.filter_shape[2]}x{self.filter_shape[3]}"
        s = "x".join(map(str, self.strides)) if self.strides[0] != self.strides[1] else str(self.strides[0])
        d = "" if self.dilation == (1, 1) else f" d{'x'.join(map(str, self.dilation))}"
        kind = "depthwise " if self.kind is LayerKind.DEPTHWISE else ""
        g = f" g{self.groups}" if self.groups > 1 else ""
        return (f"{kind}{'x'.join(map(str, self.input_shape))} * {'x'.join(map(str, self.filter_shape))} "
                f"s{s} {self.padding}{d}{g}")

    @property
    def conv_args(self) -> dict:
        return {"strides": self.strides, "padding": self.padding, "dilation": self.dilation}

    def to_dict(self) -> dict:
        return {"input_shape": list(self.input_shape), "filter_shape": list(self.filter_shape),
                "strides": list(self.strides), "padding": self.padding, "dilation": list(self.dilation),
                "name": self.name, "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: dict) -> Layer:
        return cls(tuple(data["input_shape"]), tuple(data["filter_shape"]), tuple(data["strides"]),
                   data["padding"], tuple(data["dilation"]), data.get("name", ""),
                   LayerKind(data.get("kind", LayerKind.CONV2D)))


def _role(layer: Layer, op: str) -> str:
    """Which of the layer's three ops `op` is: forward, input or filter (one line naming the
    layer's ops for an op it does not have)."""
    if op not in layer.ops:
        raise invalid_choice("op", op, layer.ops)
    return ("forward", "input", "filter")[layer.ops.index(op)]


def op_shapes(layer: Layer, op: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of `op`'s two operands at this layer: (x, w), (dy, w) or (x, dy)."""
    return {"forward": (layer.input_shape, layer.filter_shape),
            "input": (layer.output_shape, layer.filter_shape),
            "filter": (layer.input_shape, layer.output_shape)}[_role(layer, op)]


def op_result_shape(layer: Layer, op: str) -> tuple[int, ...]:
    """The shape of `op`'s result at this layer: y, dx or dw."""
    return {"forward": layer.output_shape, "input": layer.input_shape,
            "filter": layer.filter_shape}[_role(layer, op)]


def op_inputs(layer: Layer, op: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded fp16 operands of `op` at this layer: (x, w), (dy, w) or (x, dy).

    Both operands ~ U[0, 1): growing sums, so every rounding of an fp16
    accumulator shows. The second operand is scaled by a power of two that keeps
    the sums of long reductions near 2**10, far from fp16's overflow.
    """
    rng = np.random.default_rng([seed, OP_SEEDS[op], *layer.input_shape, *layer.filter_shape])
    shapes = op_shapes(layer, op)
    scale = 2.0 ** -max(0, int(np.ceil(np.log2(layer.k(op) / 4096))))
    first = rng.uniform(0.0, 1.0, shapes[0]).astype(np.float16)
    second = (rng.uniform(0.0, 1.0, shapes[1]) * scale).astype(np.float16)
    return first, second


#: The mixture `op_confirmation_inputs` draws each operand from: (share, kind).
CONFIRMATION_MIX = ((0.35, "spread"), (0.25, "uniform"), (0.3, "coarse"), (0.1, "subnormal"))


def op_confirmation_inputs(layer: Layer, op: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded fp16 operands on which a wrong model can fail: signed values (sums cancel, so an
    fp32 accumulator's association shows in the fp16 result), exponents spread over 2**-8 to
    2**4, fp16 subnormals, and coarse values (few significant bits: partial sums land exactly
    halfway between two fp16 numbers, so the tie rule shows). U[0, 1) operands (`op_inputs`)
    reveal fp16 accumulation but not the association of a wide one; these reveal both.

    The second operand is scaled by a power of two so that a random walk of K products stays
    near 2**8 (far from fp16's overflow); subnormals are drawn after scaling, so both operands
    hold them. (In a filter gradient the pair meets every input channel: those that are not
    ones are clipped to 1 in magnitude, so their outputs stay below 2**15 + the rest.)"""
    rng = np.random.default_rng([seed, 1 + OP_SEEDS[op], 0x5167, *layer.input_shape, *layer.filter_shape])
    shapes = op_shapes(layer, op)
    scale = 2.0 ** -max(0, int(np.ceil(np.log2(np.sqrt(layer.k(op)) / 16))))
    first, second = _mixture(rng, shapes[0], 1.0), _mixture(rng, shapes[1], scale)
    if layer.kind is LayerKind.DEPTHWISE:
        _plant_depthwise_pairs(_role(layer, op), first, second, rng)
    else:
        _plant_cancelling_pairs(op, first, second, rng, layer.groups)
    return first, second


#: The magnitude of each operand of `op_zero_sign_inputs`: fp16's smallest subnormal.
ZERO_SIGN_MAGNITUDE = 2.0**-24


def op_zero_sign_inputs(layer: Layer, op: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Operands whose every product is -2**-48 (or -0, where padding or a stride's zeros
    meet a weight): each output's exact sum is a negative number far below fp16's smallest
    subnormal. IEEE 754 rounds it to -0 wherever it reaches a rounding unrounded; a kernel
    that adds its sum onto a +0-initialised output returns +0 (`options.Zeros`). The
    seed is unused: the values are fixed, so every op sees the same question."""
    first_shape, second_shape = op_shapes(layer, op)
    return (np.full(first_shape, ZERO_SIGN_MAGNITUDE, np.float16),
            np.full(second_shape, -ZERO_SIGN_MAGNITUDE, np.float16))


#: The magnitude of the planted pair +M, -M: an fp16 accumulator holding M absorbs every term
#: below 2**3, an fp32 one drops the bits below 2**-9, so the terms summed between the pair
#: show in the fp16 result of either (FPRev's masked +-M inputs, Xie et al., USENIX ATC'25).
CANCELLING_MAGNITUDE = 2.0**14


def _plant_cancelling_pairs(op: str, first: np.ndarray, second: np.ndarray, rng: np.random.Generator,
                            groups: int = 1) -> None:
    """Make most outputs sum a +M and a -M product at two random places of their reduction,
    different places for different output channels: their result then depends on which terms
    the order puts between the two, so a wrong association fails where a random sum hides it.

    Two channels of the first operand become ones (in every group of a grouped conv, the same
    two of each); the second operand carries +-M where they meet it (conv2d: filter taps of
    those input channels; input gradient: filter taps of those output channels; filter
    gradient: positions of dy, for the outputs of the one-channels)."""
    channels = first.shape[-1]
    if op == "conv2d_backprop_filter":  # x (N,H,W,C) and dy (N,OH,OW,F): reduce over positions
        ones = rng.choice(channels, size=min(2, channels), replace=False)
        # every output channel's dy holds the pair, so the channels of x that are not ones meet it too: at
        # most 1 in magnitude there, their two products stay within 2**15 and the sum within fp16's range
        others = np.setdiff1d(np.arange(channels), ones)
        first[..., others] = np.clip(first[..., others], -1.0, 1.0)
        first[..., ones] = 1.0
        positions = second.shape[:3]
        for f in range(second.shape[-1]):
            plus, minus = rng.choice(int(np.prod(positions)), size=2, replace=False)
            second[(*np.unravel_index(plus, positions), f)] = CANCELLING_MAGNITUDE
            second[(*np.unravel_index(minus, positions), f)] = -CANCELLING_MAGNITUDE
        return
    # conv2d: w (KH,KW,C/g,F), outputs by F, ones at input channels of each group; input gradient:
    # w (KH,KW,C/g,F), outputs by C, ones at output channels of each group (g groups; 1 for a dense conv)
    group_size = channels // groups  # the channels of `first` one reduction meets
    if group_size < 2:
        return
    one_plus, one_minus = rng.choice(group_size, size=2, replace=False)
    for g in range(groups):
        first[..., g * group_size + one_plus] = first[..., g * group_size + one_minus] = 1.0
    taps = second.shape[:2]
    outputs = second.shape[3] if op == "conv2d" else second.shape[2]  # per group, for the input gradient
    for g in range(1 if op == "conv2d" else groups):
        for o in range(outputs):
            plus, minus = (np.unravel_index(t, taps) for t in rng.choice(int(np.prod(taps)), size=2))
            base = g * group_size
            where = ((*plus, one_plus, o), (*minus, one_minus, o)) if op == "conv2d" else \
                ((*plus, o, base + one_plus), (*minus, o, base + one_minus))
            second[where[0]] = CANCELLING_MAGNITUDE
            second[where[1]] = -CANCELLING_MAGNITUDE


def _mixture(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    shares = np.array([share for share, _ in CONFIRMATION_MIX])
    kind = rng.choice(len(shares), size=shape, p=shares / shares.sum())
    sign = rng.choice(np.array([-1.0, 1.0]), size=shape)
    spread = 2.0 ** rng.uniform(-8.0, 4.0, shape)
    uniform = rng.uniform(0.0, 1.0, shape)
    coarse = rng.choice(np.array([1.0, 1.5, 2.0, 3.0]), size=shape) * 2.0 ** rng.integers(-6, 3, shape)
    subnormal = rng.integers(1, 1024, shape) * 2.0**-24 / scale  # a subnormal once scaled
    values = np.choose(kind, [spread, uniform, coarse, subnormal]) * sign * scale
    return values.astype(np.float16)


def _plant_depthwise_pairs(role: str, first: np.ndarray, second: np.ndarray, rng: np.random.Generator) -> None:
    """`_plant_cancelling_pairs` for a depthwise layer, whose outputs each reduce one channel:
    half the channels (of x, or of dy going back) become ones, and each of their outputs
    meets a +M and a -M product; the other channels keep their random values."""
    if role == "filter":
        kh = kw = 1  # unused: this op reduces over positions
        channels = first.shape[3]
        multiplier = second.shape[3] // channels
    else:
        kh, kw, channels, multiplier = second.shape
    chosen = rng.choice(channels, size=max(1, channels // 2), replace=False)
    if role == "forward":  # x (N,H,W,C), w (KH,KW,C,mult): reduce over taps
        first[..., chosen] = 1.0
        if kh * kw < 2:
            return
        for c in chosen:
            for m in range(multiplier):
                plus, minus = (np.unravel_index(t, (kh, kw)) for t in rng.choice(kh * kw, size=2, replace=False))
                second[(*plus, c, m)], second[(*minus, c, m)] = CANCELLING_MAGNITUDE, -CANCELLING_MAGNITUDE
    elif role == "input":  # dy (N,OH,OW,C*mult), w (KH,KW,C,mult): reduce over (taps, mult)
        for c in chosen:
            first[..., c * multiplier:(c + 1) * multiplier] = 1.0
            if kh * kw * multiplier < 2:
                continue
            plus, minus = (np.unravel_index(t, (kh, kw, multiplier))
                           for t in rng.choice(kh * kw * multiplier, size=2, replace=False))
            second[(*plus[:2], c, plus[2])], second[(*minus[:2], c, minus[2])] = (CANCELLING_MAGNITUDE,
                                                                                 -CANCELLING_MAGNITUDE)
    else:  # x (N,H,W,C), dy (N,OH,OW,C*mult): reduce over positions
        first[..., chosen] = 1.0
        positions = second.shape[:3]
        if int(np.prod(positions)) < 2:
            return
        for c in chosen:
            for m in range(multiplier):
                plus, minus = rng.choice(int(np.prod(positions)), size=2, replace=False)
                second[(*np.unravel_index(plus, positions), c * multiplier + m)] = CANCELLING_MAGNITUDE
                second[(*np.unravel_index(minus, positions), c * multiplier + m)] = -CANCELLING_MAGNITUDE


def op_call(layer: Layer, op: str, first: np.ndarray, second: np.ndarray) -> tuple[str, tuple, dict]:
    """(backend method, args, kwargs) of `op` at this layer."""
    shape = {"forward": (), "input": (layer.input_shape,), "filter": (layer.filter_shape,)}[_role(layer, op)]
    return op, (first, second, *shape), dict(layer.conv_args)


def run_op(backend, layer: Layer, op: str, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """`op` of this layer on a backend (TensorFlow or the emulator): fp16 outputs."""
    method, args, kwargs = op_call(layer, op, first, second)
    return np.asarray(getattr(backend, method)(*args, **kwargs)).astype(np.float16)


def run_ops(backend, layer: Layer, op: str, operands) -> list[np.ndarray]:
    """`run_op` on several (first, second) pairs: one XLA compilation where the backend
    offers `run_together` (TensorFlow), one call each otherwise."""
    calls = [op_call(layer, op, first, second) for first, second in operands]
    if hasattr(backend, "run_together"):
        return [np.asarray(raw).astype(np.float16) for raw in backend.run_together(calls)]
    return [run_op(backend, layer, op, first, second) for first, second in operands]


@dataclass(frozen=True)
class NotIdentified:
    """A conv-like layer of a user's model that identify does not measure, and why: it is
    listed in the table, the JSON and the figure, never dropped without a word."""

    name: str
    kind: str
    reason: str

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "reason": self.reason}


#: The Keras layer kinds identify measures.
MEASURED_KINDS = ("Conv1D", "Conv2D", "Conv2DTranspose", "DepthwiseConv2D", "SeparableConv2D", "Dense")


def _not_measured_reason(item) -> str | None:
    """Why identify cannot measure this Keras layer (None: one it can)."""
    kind = type(item).__name__
    if kind not in MEASURED_KINDS or type(item).__module__.split(".")[0] != "keras":
        return (f"{kind}: identify measures {', '.join(MEASURED_KINDS)} layers (a Dense as its matmul); "
                f"this one runs TensorFlow's kernel unmeasured")
    if kind == "Dense":
        mode = getattr(item, "quantization_mode", None)
        return None if mode is None else f"a quantized Dense ({mode}): identify measures fp16 matmuls only"
    if item.data_format != "channels_last":
        return f"data_format {item.data_format}: identify measures channels_last (NHWC) convolutions only"
    return None


def _measurable(item) -> bool:
    """A layer whose work is a reduction an arithmetic could change: a convolution (Keras names
    every one ...Conv...), a Dense, or any other layer with a kernel (listed if not measured)."""
    if "Conv" in type(item).__name__ and hasattr(item, "kernel_size"):
        return True
    try:
        return getattr(item, "kernel", None) is not None
    except (AttributeError, ValueError):  # a kernel property of a layer not built
        return False


#: A Keras conv layer's strides, padding and dilation, as `Layer` takes them.
_Geometry = tuple[tuple[int, int], str, tuple[int, int]]


def _transposed(item, input_shape: tuple[int, int, int, int], geometry: _Geometry) -> Layer:
    """The conv2d a Conv2DTranspose transposes. TensorFlow computes the transposed layer's
    forward as that conv2d's Conv2DBackpropInput (dy = the layer's input, the same HWIO
    kernel), and the registered gradient of that op is the conv2d itself (the input
    gradient) and its Conv2DBackpropFilter (the filter gradient): the same three ops, at the
    conv2d's shapes, so the conv2d's map is the transposed layer's."""
    kh, kw = item.kernel_size
    h, w, filters = (int(size) for size in item.output.shape[1:])
    layer = Layer((input_shape[0], h, w, filters), (kh, kw, filters, input_shape[3]), *geometry,
                  f"{item.name}{TRANSPOSED_SUFFIX}")
    if layer.output_shape != input_shape:  # (an output_padding the conv2d does not map back)
        raise InvalidArgument(f"its conv2d of input {layer.input_shape[1:3]} gives {layer.output_shape[1:3]}, not the "
                              f"layer's input {input_shape[1:3]}: identify measures a Conv2DTranspose as that conv2d")
    return layer


def _conv1d(item, input_shape: tuple[int, int, int, int]) -> Layer:
    """The conv2d of height 1 TensorFlow runs a Conv1D as (input (N, 1, L, C)): causal padding
    is applied before it, as Keras does, and the conv2d is VALID."""
    causal = item.padding == "causal"
    n, _, length, channels = input_shape
    extra = item.dilation_rate[0] * (item.kernel_size[0] - 1) if causal else 0
    return Layer((n, 1, length + extra, channels), (1, item.kernel_size[0], channels // int(item.groups),
                                                    int(item.filters)),
                 (1, item.strides[0]), "VALID" if causal else item.padding.upper(), (1, item.dilation_rate[0]),
                 item.name)


def _input_shape(item, batch: int) -> tuple[int, int, int, int]:
    """The NHWC shape identify measures `item` at: a Conv1D's (N, 1, L, C); a Dense's
    (rows, 1, 1, K), its leading axes one batch of rows (TensorFlow's matmul of the
    flattened input)."""
    try:
        shape = tuple(item.input.shape)
    except (AttributeError, ValueError) as exc:
        raise InvalidArgument("its input shape is not known (is the model built?)") from exc
    rank = {"Dense": None, "Conv1D": 3}.get(type(item).__name__, 4)
    if None in shape[1:] or (rank is not None and len(shape) != rank):
        raise InvalidArgument(f"input shape {shape} has an unknown size; identify needs "
                              f"fixed sizes but the batch (save the model with a fixed input)")
    sizes = [int(size) for size in shape[1:]]
    if type(item).__name__ == "Dense":
        return (batch * math.prod(sizes[:-1]), 1, 1, sizes[-1])
    if len(sizes) == 2:
        return (batch, 1, sizes[0], sizes[1])
    return (batch, sizes[0], sizes[1], sizes[2])


def _layers_of(item, input_shape: tuple[int, int, int, int]) -> list[Layer]:
    """The probe layers a Keras layer runs: a Dense one matmul, a Conv1D the conv2d of height
    1 (`_conv1d`), a Conv2D one conv2d, a Conv2DTranspose the
    conv2d it transposes (`_transposed`), a DepthwiseConv2D one depthwise conv, a
    SeparableConv2D a depthwise conv then a 1x1 conv2d (as `tf.nn.separable_conv2d`
    computes it)."""
    import keras

    if type(item) is keras.layers.Dense:
        return [Layer(input_shape, (1, 1, input_shape[3], int(item.units)), (1, 1), "VALID", (1, 1), item.name,
                      LayerKind.MATMUL)]
    if type(item) is keras.layers.Conv1D:
        return [_conv1d(item, input_shape)]
    kh, kw = item.kernel_size
    geometry: _Geometry = (tuple(item.strides), item.padding.upper(), tuple(item.dilation_rate))
    channels = input_shape[3]
    if type(item) is keras.layers.Conv2D:  # (grouped: each filter reads its group's channels)
        return [Layer(input_shape, (kh, kw, channels // int(item.groups), int(item.filters)), *geometry, item.name)]
    if type(item) is keras.layers.Conv2DTranspose:
        return [_transposed(item, input_shape, geometry)]
    multiplier = int(item.depth_multiplier)
    depthwise = Layer(input_shape, (kh, kw, channels, multiplier), *geometry, item.name, LayerKind.DEPTHWISE)
    if type(item) is keras.layers.DepthwiseConv2D:
        return [depthwise]
    pointwise_input = (*depthwise.output_shape[:3], channels * multiplier)
    return [Layer(depthwise.input_shape, depthwise.filter_shape, *geometry, f"{item.name}/depthwise",
                  LayerKind.DEPTHWISE),
            Layer(pointwise_input, (1, 1, channels * multiplier, int(item.filters)), (1, 1), "VALID", (1, 1),
                  f"{item.name}/pointwise")]


def keras_layers(model, batch: int) -> tuple[list[Layer], list[NotIdentified]]:
    """Every distinct conv2d, depthwise and matmul layer of a built Keras model (`MEASURED_KINDS`:
    both halves of a SeparableConv2D, a Dense's matmul), at this batch size, in model order,
    and every other layer with a kernel, with the reason identify does not measure it."""

    def walk(parent):
        for item in getattr(parent, "layers", ()):
            yield item
            yield from walk(item)

    import keras

    found: dict[Layer, None] = {}
    skipped: list[NotIdentified] = []
    for item in walk(model):
        if isinstance(item, keras.Model) or not _measurable(item):
            continue
        reason = _not_measured_reason(item)
        if reason is not None:
            skipped.append(NotIdentified(item.name, type(item).__name__, reason))
            continue
        try:
            for layer in _layers_of(item, _input_shape(item, batch)):
                found.setdefault(layer, None)
        except InvalidArgument as exc:
            raise InvalidArgument(f"layer {item.name}: {exc}") from None
    if not found:
        listed = "; ".join(f"{s.name} ({s.reason})" for s in skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        raise InvalidArgument(f"the model has no layer identify measures ({', '.join(MEASURED_KINDS)})"
                              + (f"; not measured: {listed}" if skipped else ""))
    return list(found), skipped
