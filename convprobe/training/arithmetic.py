"""Which arithmetic each convolution of a training run computes.

Three answers (`ArithmeticKind`):

- `native`: TensorFlow's own kernels, whatever they do;
- a model spec or GPU preset (`v100:out=fp16`, `a100`, `sequential:fp16`): the exact
  emulator computes every conv, forward and both gradients, under that one model. It
  answers "what would this arithmetic do to my training" from a CPU;
- `twin`: per layer and op, the model identify measured in this TensorFlow
  configuration. A twin step must reproduce TensorFlow's own step bit for bit, which
  turns identify's per-layer claims into one claim that can fail. An op identify found
  no model for runs TensorFlow's own kernel, and the records say so.

No TensorFlow here: this module decides, `emulated_conv` computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from convprobe import results
from convprobe.emulation import AccumulationModel, Blocked, parse_model
from convprobe.errors import InvalidArgument
from convprobe.options import ArithmeticKind, ConvOp
from convprobe.render import share_text

__all__ = ["ArithmeticKind", "ConvOp", "OpFamily", "ConvShape", "OpArithmetic", "LayerArithmetic", "Arithmetic",
           "GPU_PRESET_SCOPE", "TwinMap", "identify_command", "read_identify_map", "twin_layers"]


#: What a GPU preset models, and what it does not: written into the run's header.
GPU_PRESET_SCOPE = (
    "a GPU preset models the tensor core's MMA instruction (products, alignment, accumulator "
    "format, measured bit for bit on real GPUs) chained along K in order; it does not model "
    "cuDNN's choice of algorithm per layer (split-K, Winograd, FFT, the order of its tiles)")


class OpFamily(StrEnum):
    """Which three ops a layer's step runs (identify's layer kinds): a conv2d's, a depthwise
    conv's, or a Dense layer's matmuls, each family's shape written as a conv2d's (a matmul's
    as the 1x1 conv2d of input (rows, 1, 1, K) and filter (1, 1, K, units))."""

    CONV2D = "conv2d"
    DEPTHWISE = "depthwise"
    MATMUL = "matmul"

    @property
    def op_names(self) -> dict[ConvOp, str]:
        """Each role's op as identify names it in this family."""
        names = {OpFamily.CONV2D: tuple(ConvOp),
                 OpFamily.DEPTHWISE: ("depthwise_conv2d", "depthwise_conv2d_backprop_input",
                                      "depthwise_conv2d_backprop_filter"),
                 OpFamily.MATMUL: ("matmul", "matmul_input_gradient", "matmul_kernel_gradient")}[self]
        return dict(zip(ConvOp, map(str, names)))


@dataclass(frozen=True)
class ConvShape:
    """A conv layer as identify keys it: NHWC input, HWIO filter, strides, padding, dilation."""

    input_shape: tuple[int, int, int, int]
    filter_shape: tuple[int, int, int, int]
    strides: tuple[int, int]
    padding: str
    dilation: tuple[int, int]

    @classmethod
    def from_dict(cls, data: Mapping) -> ConvShape:
        return cls(tuple(data["input_shape"]), tuple(data["filter_shape"]), tuple(data["strides"]),
                   str(data["padding"]).upper(), tuple(data["dilation"]))

    def to_dict(self) -> dict:
        return {"input_shape": list(self.input_shape), "filter_shape": list(self.filter_shape),
                "strides": list(self.strides), "padding": self.padding, "dilation": list(self.dilation)}


@dataclass(frozen=True)
class OpArithmetic:
    """One op's arithmetic: an emulated model, or TensorFlow's kernel (model None), and why."""

    model: AccumulationModel | None
    source: str

    @property
    def label(self) -> str:
        return "tensorflow" if self.model is None else self.model.to_spec()


@dataclass(frozen=True)
class LayerArithmetic:
    """One layer's (or one part's: a SeparableConv2D's depthwise half) three ops: their shape
    as identify keys it, and each role's arithmetic (`ConvOp`, named in records by `family`)."""

    name: str
    shape: ConvShape
    ops: Mapping[ConvOp, OpArithmetic]
    family: OpFamily = OpFamily.CONV2D

    @property
    def emulated(self) -> bool:
        return any(op.model is not None for op in self.ops.values())

    def to_dict(self) -> dict:
        names = self.family.op_names
        return {"layer": self.name, **self.shape.to_dict(),
                "ops": {names[op]: {"arithmetic": a.label, "source": a.source} for op, a in self.ops.items()}}


def identify_command(shapes: Mapping[str, ConvShape], configuration: str, resnet_size: int,
                     image_size: int, output: str) -> str:
    """The identify command that measures the map this run needs."""
    batch = next(iter(shapes.values())).input_shape[0]
    return (f"convprobe identify --resnet-size {resnet_size} --image-size {image_size} --batch {batch} "
            f"--configs {configuration} --output {output}")


@dataclass(frozen=True)
class Arithmetic:
    """The run's arithmetic as the user named it (`text`), parsed once."""

    kind: ArithmeticKind
    model: AccumulationModel | None = None
    text: str = field(default="native")

    @classmethod
    def parse(cls, text: str) -> Arithmetic:
        value = str(text).strip()
        if value in (ArithmeticKind.NATIVE, ArithmeticKind.TWIN):
            return cls(ArithmeticKind(value), None, value)
        try:
            model = parse_model(value)
        except InvalidArgument as error:
            raise InvalidArgument(
                f"--arithmetic must be native, twin, or a model spec or GPU preset (e.g. v100:out=fp16, "
                f"a100, sequential:fp16); received {value!r} ({error})") from None
        return cls(ArithmeticKind.SPEC, model, model.to_spec())

    @property
    def emulated(self) -> bool:
        return self.kind is not ArithmeticKind.NATIVE

    @property
    def gpu_preset(self) -> bool:
        """Whether the run computes a GPU preset's tensor-core model (a100, v100:out=fp16)."""
        return isinstance(self.model, Blocked) and self.model.preset is not None

    def layers(self, shapes: Mapping[str, ConvShape], identify_map: dict | None = None,
               configuration: str = "default") -> dict[str, LayerArithmetic]:
        """Each conv layer's arithmetic (`shapes`: layer name -> shape, in the network's order).
        The twin reads `identify_map`, an identify document that measured these shapes in
        `configuration`."""
        if self.kind is ArithmeticKind.NATIVE:
            return {name: LayerArithmetic(name, shape, {op: OpArithmetic(None, "native") for op in ConvOp})
                    for name, shape in shapes.items()}
        if self.kind is ArithmeticKind.SPEC:
            source = f"--arithmetic {self.text}"
            return {name: LayerArithmetic(name, shape, {op: OpArithmetic(self.model, source) for op in ConvOp})
                    for name, shape in shapes.items()}
        if identify_map is None:
            raise InvalidArgument("--arithmetic twin needs an identify map of this run's layers")
        return twin_layers(identify_map, shapes, configuration)


def read_identify_map(path: str | Path, *, argument: str = "--arithmetic-map") -> dict:
    """An identify document (`convprobe identify ... --output FILE.json`), validated; `argument`
    names it in messages (the option, or a Python keyword)."""
    try:
        return results.read(path, kinds=(results.Kind.IDENTIFY,))
    except InvalidArgument as error:
        raise InvalidArgument(f"{argument}: {error}") from None


def _configuration_result(document: dict, configuration: str) -> dict:
    found = [r for r in document.get("results", []) if (r.get("config") or {}).get("name") == configuration]
    names = sorted({name for r in document.get("results", []) if (name := (r.get("config") or {}).get("name"))})
    if not found:
        held = f"its configurations are {', '.join(names)}" if names else "it holds no TensorFlow configuration"
        raise InvalidArgument(f"the identify map has no results for configuration {configuration!r}; {held} "
                              f"(measure one with identify --configs {configuration})")
    result = found[0]
    if result.get("status") != "ok" or "layers" not in (result.get("observed") or {}):
        raise InvalidArgument(f"the identify map's configuration {configuration!r} has no layer results "
                              f"(status {result.get('status')!r}); measure it in layer mode")
    return result


def _unmeasured(name: str, shape: ConvShape, missing: int, total: int, measured, configuration: str) -> str:
    """Which shape of this run's layers the map lacks, beside what the map measured: the same
    filter at another input (another batch or image size), or no such filter (another model)."""
    same_filter = sorted({str(s.input_shape) for s in measured
                          if (s.filter_shape, s.strides) == (shape.filter_shape, shape.strides)})
    differs = (f"the map has this filter at input {', '.join(same_filter[:3])}: it was measured at another batch "
               f"or image size" if same_filter else "the map has no layer with this filter and strides: it "
               "was measured on another model (depth or width)")
    have = sorted({f"{s.input_shape} * {s.filter_shape}" for s in measured})
    return (f"the identify map did not measure layer {name} (input {shape.input_shape} * filter {shape.filter_shape}, "
            f"strides {shape.strides}) in configuration {configuration!r}; {differs} ({missing} of "
            f"{total} layers missing; it measured {', '.join(have[:3])}{' ...' if len(have) > 3 else ''}): "
            f"measure this run's own layers")


@dataclass(frozen=True)
class TwinMap:
    """An identify map's answers in one configuration, read once: per measured layer (its op
    family and shape), each role's arithmetic (`_op_arithmetic`)."""

    configuration: str
    layers: Mapping[tuple[OpFamily, ConvShape], Mapping[ConvOp, OpArithmetic]]

    @classmethod
    def read(cls, document: dict, configuration: str) -> TwinMap:
        result = _configuration_result(document, configuration)
        label = result["config"]["label"]
        matches = (document.get("matches") or {}).get(label, {})
        entries = result["observed"]["layers"]
        layers: dict[tuple[OpFamily, ConvShape], Mapping[ConvOp, OpArithmetic]] = {}
        for entry in entries:
            family = OpFamily(entry["layer"].get("kind", OpFamily.CONV2D))
            where = entry["layer"].get("name", "")
            ops = {}
            for role, op in family.op_names.items():
                cell = op if len(entries) == 1 else f"{where} / {op}"
                if cell not in matches:
                    raise InvalidArgument(f"the identify map has no result for {cell!r} in configuration "
                                          f"{configuration!r}: measure this run's layers with identify's layer mode")
                ops[role] = _op_arithmetic(matches[cell].get("summary") or {},
                                           f"identify ({configuration}, layer {where})")
            layers.setdefault((family, ConvShape.from_dict(entry["layer"])), ops)
        return cls(configuration, layers)

    def layer_arithmetic(self, shapes: Mapping[str, ConvShape],
                         family: OpFamily = OpFamily.CONV2D) -> dict[str, LayerArithmetic]:
        """Each named layer's arithmetic (its shape measured in the map), or one line naming the
        first layer the map did not measure and what it did measure."""
        measured = [shape for kind, shape in self.layers if kind is family]
        missing = [name for name, shape in shapes.items() if (family, shape) not in self.layers]
        if missing:
            raise InvalidArgument(_unmeasured(missing[0], shapes[missing[0]], len(missing), len(shapes), measured,
                                              self.configuration))
        return {name: LayerArithmetic(name, shape, self.layers[(family, shape)], family)
                for name, shape in shapes.items()}


def twin_layers(document: dict, shapes: Mapping[str, ConvShape], configuration: str) -> dict[str, LayerArithmetic]:
    """The twin's arithmetic from an identify map: per conv layer and op, the model identify
    reports (`best`, where it matched every output of both input sets and identify did not
    set it aside); TensorFlow's own kernel where there is none."""
    return TwinMap.read(document, configuration).layer_arithmetic(shapes)


def _op_arithmetic(summary: dict, where: str) -> OpArithmetic:
    """identify's reported model for one cell, or TensorFlow's kernel and why."""
    best, perfect, fractions = summary.get("best"), summary.get("perfect") or [], summary.get("fractions") or {}
    if best is not None and best in perfect and summary.get("stops_matching_at") is None:
        return OpArithmetic(parse_model(best), f"{where}: every output of both input sets")
    share = f" (closest {best}: {share_text(min(fractions.values()))})" if best and fractions else ""
    return OpArithmetic(None, f"TensorFlow's own kernel: {where} found no model that matches every output{share}")
