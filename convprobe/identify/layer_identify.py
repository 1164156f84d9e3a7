"""`identify` at the user's own layers: measure each op's structure, then confirm it.

The `identify` probe runs this mode when its params carry `layers`, so a layer
map is an ordinary identify document (params.layers, matches keyed by op, or by
'layer / op' for a map).

For every layer and each of its three ops (`Layer.ops`: conv2d's or a depthwise conv's) the child process
(the backend's own) does four things at the layer's exact shape:

1. runs the op on three sets of seeded fp16 inputs and returns the bit patterns of up to
   `SAMPLE` outputs of each, picked by seed: U[0, 1) operands (`layers.op_inputs`), on
   which fp16 accumulation shows; operands on which a wrong model can fail
   (`layers.op_confirmation_inputs`: signed, spread exponents, subnormals, ties and a
   cancelling +-M pair in each reduction, so a wide accumulator's association shows); and
   operands whose every product is -2**-48, which ask the sign of a zero result;
2. tests that the op is a direct sum of products at all (`direct_sum`): a Winograd or
   FFT convolution is said to be one, not fitted with a dot-product model;
3. measures the reduction's structure with crafted inputs (`structure.measure`):
   accumulator, partial-sum boundaries, interleaved lanes, product rounding, one
   row a channel, and again column by column of the op's GEMM (`column_patterns`);
4. recovers the summation trees (`layer_trees`), unless told `trees=needed` (the default)
   and one of the first specs of the structure reproduces every output of the three sets
   and of three further confirmation sets (`_settling_spec`): that spec is then recorded
   as ``settled`` and the parent reports a spec only where it is the same arithmetic.

The parent turns the structure into emulator specs (`candidates.candidate_specs`; where
the columns differ, first the one spec of them all, `column_patterns.column_models`),
adds those the layer's layout suggests (`layer_patterns`: an input gradient's one-tap
chunks), a few plain models (`BASE_CANDIDATES`) and any the
user names, recomputes
the same op through the emulator's conv API for each, and counts the outputs
that match bit for bit. Each spec that matches every output of the first set must then
match every output of the second (`confirmation` in the summary): a spec is reported at
100% only when it reproduced both. The best spec is the measured one when it matches; a
summary says plainly what was measured and ruled out when nothing matches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from convprobe.backends.emulated import EmulatedBackend
from convprobe.emulation import parse_model
from convprobe.errors import InvalidArgument, UnsupportedConfiguration
from convprobe.options import TreeRecovery, Zeros, parse_option
from convprobe.identify.column_patterns import ColumnRun, column_models
from convprobe.identify.depthwise_as_grouped import AsGrouped, grouped_layer, grouped_op
from convprobe.identify.input_gradient_layout import forward_layer
from convprobe.identify.layer_patterns import measure
from convprobe.identify.matmul_as_conv import measured_form
from convprobe.identify.layer_trees import RecoveredTrees, recover_at_layer, tree_specs
from convprobe.identify.tile_patterns import RowRun, dx_row_models, row_models
from convprobe.identify import direct_sum
from convprobe.identify.direct_sum import DirectSum, not_direct
from convprobe.probes.encoding import encode_bits
from convprobe.probes.layers import (Layer, LayerKind, op_confirmation_inputs, op_inputs, op_result_shape,
                                     op_zero_sign_inputs, run_op, run_ops)
from convprobe.identify.candidates import candidate_specs
from convprobe.identify.structure import Structure, best_of, bitwise_equal
from convprobe.render import share_text

__all__ = ["BASE_CANDIDATES", "DEPTHWISE_NOTE", "GROUPED_NOTE", "depthwise_candidates", "SAMPLE", "run", "interpret", "identify_observed", "sample_indices"]

#: Plain models tried beside the measured ones: exact, fp32 and fp16 sequential, pairwise.
BASE_CANDIDATES = (
    "exact:fp64:output=fp16", "sequential:fp32:output=fp16", "pairwise:fp32:output=fp16",
    "sequential:fp16", "sequential:fp16:product=fp16",
)
#: Outputs compared per op (all of them when the op has fewer).
SAMPLE = 8192
#: How many of the closest specs are confirmed beside the perfect ones (the best of them is shown).
CONFIRMED_CLOSEST = 3
#: The input sets every op runs on: the first chooses, the second confirms, the third asks the
#: sign of a zero result (`layers.op_zero_sign_inputs`).
INPUT_SETS = {"uniform": op_inputs, "confirmation": op_confirmation_inputs, "zero_sign": op_zero_sign_inputs}
#: Further seeded confirmation input sets on which two specs must agree to be one arithmetic, and on
#: which a measured spec must reproduce the op for its trees to go unrecovered.
SAME_ARITHMETIC_SETS = 3
#: The sets a settling spec reproduces every output of: the input sets and those further ones.
SETTLING_SETS = len(INPUT_SETS) + SAME_ARITHMETIC_SETS
#: The seed step between those sets.
CONFIRMATION_SEED_STEP = 7919
#: How a trees note begins where a spec made the trees unnecessary (`TreeRecovery.NEEDED`).
NOT_NEEDED = "summation trees not recovered (not needed)"
#: How many of the measured and layout specs the child tries before it recovers the trees, in
#: `_measured_candidates`' order (its row and column variants, the measured structure's own
#: spec, then the layer's layouts).
SETTLING_CANDIDATES = 4
#: What the confirmation inputs are, in the words the summary records.
CONFIRMATION_INPUTS = ("signed operands, exponents from 2**-8 to 2**4, fp16 subnormals, coarse values that "
                       "make ties, and a cancelling +-M pair in each reduction (layers.op_confirmation_inputs)")


#: Why a depthwise op has no measured structure and no direct-sum test, and what it has.
DEPTHWISE_NOTE = ("identify's structure probes are laid out for a dense conv2d; the models of TensorFlow's CPU "
                  "depthwise kernels and plain models are tried, each confirmed on both input sets, and where none "
                  "reproduces the op the summation trees are recovered through its own kernel as the grouped conv2d "
                  "it is (depthwise_as_grouped)")


#: How a grouped conv2d is measured: the crafted-structure probes (and the direct-sum test) are
#: laid out for a dense conv2d, so they run at one group's; the summation trees are recovered
#: through the grouped op itself, and every spec is confirmed on the grouped layer's own outputs.
GROUPED_NOTE = ("a grouped conv2d's structure is measured at the conv2d of one group; its summation trees, where "
                "needed, through the grouped op itself; every spec is confirmed on the grouped layer's own outputs")


def depthwise_candidates(layer: Layer, op: str) -> tuple[str, ...]:
    """The models a depthwise op is tried against beside the plain ones: the loops of
    TensorFlow's CPU kernels (tensorflow/core/kernels/depthwise_conv_op.cc and
    depthwise_conv_grad_op.cc), whose Eigen half packets multiply and add in fp32 and round
    each sum to fp16. The forward conv sums each channel's taps in order; the input gradient
    sums each (channel, multiplier) over the taps from the last, then the multipliers from
    the last; the filter gradient sums each image's positions in order, then adds the images'
    sums in fp16 (strict XLA does the same with each product rounded to fp16). Confirmation,
    not this list, decides: a kernel that does otherwise matches none of them."""
    kh, kw, _, multiplier = layer.filter_shape
    role = layer.ops.index(op)
    if role == 0:
        return ("sequential:fp16:addition=fp32",)
    if role == 1:
        per_tap = "sequential:fp16:addition=fp32"
        return (f"reverse({per_tap})",) if multiplier == 1 else (
            f"reverse(lanes({multiplier}, {per_tap}, combine=reverse(sequential:fp16)))",)
    _, oh, ow, _ = layer.output_shape
    # the second: strict XLA's grouped filter gradient, which rounds each product to fp16
    return tuple(f"chunked:fp16:n={oh * ow}:{rounding}:total=fp16" for rounding in ("addition=fp32", "product=fp16"))


def sample_indices(size: int, seed: int) -> np.ndarray:
    """The flat output indices compared: all, or `SAMPLE` of them drawn by seed."""
    if size <= SAMPLE:
        return np.arange(size)
    return np.sort(np.random.default_rng([seed, size]).choice(size, SAMPLE, replace=False))


def run(backend, *, layers, seed: int = 0, trees: str = TreeRecovery.NEEDED, **_params) -> dict:
    """Child side: per layer and op, the measured structure and sampled output bits; the
    summation trees where `trees` asks for them (`TreeRecovery`)."""
    recovery = parse_option("trees", trees, TreeRecovery)
    out = []
    for data in layers:
        layer = Layer.from_dict(data)
        ops = {}
        for op in layer.ops:
            at, at_op, at_backend = measured_form(layer, op, backend)  # a matmul as its 1x1 conv2d
            ops[op] = _measured_op(at_backend, at, at_op, seed, recovery)
        out.append({"layer": layer.to_dict(), "ops": ops})
    return {"layers": out, "seed": seed}


def _measured_op(backend, layer: Layer, op: str, seed: int, recovery: TreeRecovery) -> dict:
    """One op at one layer, in the child: its sampled output bits on each input set, its
    direct-sum test, its measured structure and, where needed, its summation trees."""
    try:
        drawn = {name: draw(layer, op, seed) for name, draw in INPUT_SETS.items()}
        with np.errstate(over="ignore", invalid="ignore"):
            outputs = dict(zip(drawn, run_ops(backend, layer, op, list(drawn.values()))))
        bits = {name: encode_bits(y.reshape(-1)[sample_indices(y.size, seed)]) for name, y in outputs.items()}
        if layer.kind is LayerKind.DEPTHWISE:  # its trees through its own kernels, as a grouped conv2d
            direct = DirectSum(None, note=f"not tested: {DEPTHWISE_NOTE}")
            structure = Structure(note=f"not measured: {DEPTHWISE_NOTE}",
                                  derived=depthwise_candidates(layer, op))
        else:  # a grouped conv's structure at one group's conv2d (GROUPED_NOTE), its trees at itself
            at = layer.one_group() if layer.groups > 1 else layer
            direct = direct_sum.safely(direct_sum.probe, backend, at, op, seed)
            structure = measure(backend, at, op, seed)
        settled = (_settling_spec(backend, layer, op, structure, drawn, outputs, seed)
                   if recovery is TreeRecovery.NEEDED and direct.direct is not False else None)
        if direct.direct is False:
            recovered = RecoveredTrees(note="not recovered: the op is not a direct sum of products")
        elif settled is not None:
            recovered = RecoveredTrees(note=f"{NOT_NEEDED}: {settled} reproduces every output of the op on "
                                            f"the three input sets and on {SAME_ARITHMETIC_SETS} further "
                                            f"seeded confirmation sets")
        elif layer.kind is LayerKind.DEPTHWISE:
            recovered = recover_at_layer(AsGrouped(backend, layer), grouped_layer(layer), grouped_op(op), seed)
        else:
            recovered = recover_at_layer(backend, layer, op, seed)
        return {"status": "ok", "bits": bits["uniform"], "confirmation_bits": bits["confirmation"],
                "zero_sign_bits": bits["zero_sign"], "settled": settled,
                "direct": direct.to_dict(), "structure": structure.to_dict(), "trees": recovered.to_dict()}
    except UnsupportedConfiguration as exc:
        return {"status": "unsupported", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one failing op must not hide the others
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}


def _settling_spec(backend, layer: Layer, op: str, structure: Structure,
                   drawn: dict[str, tuple[np.ndarray, np.ndarray]], outputs: dict[str, np.ndarray],
                   seed: int) -> str | None:
    """The spec that makes the op's trees unnecessary, or None: the first of the specs of its
    measured structure and of the layer's layout (`SETTLING_CANDIDATES`; with
    ``zeros=positive`` where the zero-sign inputs ask for it, `_positive_zeros`) that
    reproduces every output of the op on the input sets `drawn` and on
    `SAME_ARITHMETIC_SETS` further seeded confirmation sets, run on the op only then."""
    measured = _measured_candidates(layer.one_group() if layer.groups > 1 else layer, op, structure)[0]
    further: list[tuple[tuple[np.ndarray, np.ndarray], np.ndarray]] = []
    signs = outputs["zero_sign"].view(np.uint16)
    for spec in list(dict.fromkeys([*measured, *structure.derived]))[:SETTLING_CANDIDATES]:
        try:
            predicted = _emulated(spec, layer, op, drawn["zero_sign"])
            if _positive_zeros(predicted, signs):
                spec = replace(parse_model(spec), zeros=Zeros.POSITIVE).to_spec()
                predicted = _emulated(spec, layer, op, drawn["zero_sign"])
            if not bitwise_equal(predicted, signs).all() or not all(
                    bitwise_equal(_emulated(spec, layer, op, drawn[name]), outputs[name].view(np.uint16)).all()
                    for name in drawn if name != "zero_sign"):
                continue
        except InvalidArgument:  # a model that cannot take this op
            continue
        if not further:
            sets = _further_sets(layer, op, seed)
            with np.errstate(over="ignore", invalid="ignore"):
                further = [(inputs, y.view(np.uint16)) for inputs, y in zip(sets, run_ops(backend, layer, op, sets))]
        if all(bitwise_equal(_emulated(spec, layer, op, inputs), observed).all() for inputs, observed in further):
            return spec
    return None


def _positive_zeros(predicted: np.ndarray, observed: np.ndarray) -> bool:
    """Whether fp16 bits `observed` are `predicted` with some -0 results +0 and nothing else
    changed: a kernel that adds its sum onto a +0-initialised output."""
    differ = predicted != observed
    return bool(differ.any() and (predicted[differ] == NEGATIVE_ZERO).all() and (observed[differ] == 0).all())


def _emulated(spec: str, layer: Layer, op: str, inputs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Every output of `op` at `layer` under `spec`, as fp16 bits."""
    with np.errstate(over="ignore", invalid="ignore"):
        return run_op(EmulatedBackend(spec), layer, op, *inputs).view(np.uint16)


_PREDICTIONS: dict[tuple, np.ndarray | None] = {}
_LOCK = threading.Lock()


def _predicted(spec: str, layer: Layer, op: str, seed: int, inputs: str = "uniform") -> np.ndarray | None:
    """The sampled fp16 bits of `spec` on the op's seeded inputs of one set (`INPUT_SETS`,
    cached across configurations); None if the model cannot take them."""
    key = (spec, layer, op, seed, inputs)
    with _LOCK:
        if key not in _PREDICTIONS:
            first, second = INPUT_SETS[inputs](layer, op, seed)
            try:
                y = _emulated(spec, layer, op, (first, second)).reshape(-1)
                _PREDICTIONS[key] = y[sample_indices(y.size, seed)]
            except InvalidArgument:
                _PREDICTIONS[key] = None
        return _PREDICTIONS[key]


def _summary(layer: Layer, op: str, result: dict, seed: int, extra_specs) -> dict:
    k = layer.k(op)
    structure = Structure(**result["structure"])
    measured_at = layer.one_group() if layer.groups > 1 else layer  # where the structure was measured
    signed_zeros = _zero_sign(layer, op, seed, result.get("zero_sign_bits"))
    measured, by_column, by_row, others = _measured_candidates(measured_at, op, structure, signed_zeros)
    observed = np.array([int(h, 16) for h in result["bits"]], dtype=np.uint16)
    table = {}
    candidates = [*measured, *structure.derived, *(extra_specs or ()), *BASE_CANDIDATES]
    for spec in dict.fromkeys(signed_zeros(spec) for spec in candidates):
        predicted = _predicted(spec, layer, op, seed)
        if predicted is not None:
            table[spec] = float(np.mean(bitwise_equal(predicted, observed)))
    trees = RecoveredTrees.from_dict(result.get("trees"))
    sampled = sample_indices(int(np.prod(op_result_shape(layer, op))), seed)

    def score(spec: str, cells=None) -> float:
        """The share of sampled outputs `spec` matches, among `cells` (a (GEMM row, column)
        mask of the result) where given."""
        predicted = _predicted(spec, layer, op, seed)
        if predicted is None:
            return 0.0
        keep = np.ones(len(observed), bool) if cells is None else cells.reshape(-1)[sampled]
        return float(np.mean(bitwise_equal(predicted[keep], observed[keep]))) if keep.any() else 0.0

    at, as_op = (grouped_layer(layer), grouped_op(op)) if layer.kind is LayerKind.DEPTHWISE else (layer, op)
    recovered = [spec for spec in dict.fromkeys(signed_zeros(spec) for spec in tree_specs(at, as_op, trees, structure, score))
                 if spec not in table]
    for spec in recovered:  # after the grammar's specs: a readable spec wins a tie where it is the same arithmetic
        table[spec] = score(spec, None)
    settled = result.get("settled")  # the spec that reproduced the op on every settling set, where trees were not needed
    if settled and settled not in table:
        table[settled] = score(settled, None)
    direct = DirectSum.from_dict(result["direct"]) if result.get("direct") else None  # older documents lack it
    confirmation = _confirm(table, layer, op, seed, result.get("confirmation_bits"))
    scores = {spec: min(fraction, confirmation["fractions"].get(spec, fraction)) for spec, fraction in table.items()}
    perfect = [s for s, f in scores.items() if f == 1.0]
    if direct is not None and direct.direct is False:  # say so rather than fit a dot-product model
        best, explanation = None, f"{direct.reason}; no dot-product model applies; closest tried: {_closest(table)}"
    else:
        best = best_of(scores) if scores else None
        disagree = []
        tree_best = next((spec for spec in recovered if scores.get(spec) == 1.0), None)
        # the recovered tree, or the spec that reproduced the op on every settling set: a spec that
        # matched both input sets is reported only where it is the same arithmetic
        reference = tree_best or (settled if settled and scores.get(settled) == 1.0 else None)
        if best is not None and reference is not None and best not in recovered and best != reference:
            disagree = [spec for spec in perfect if spec not in recovered and spec != reference
                        and not _same_arithmetic(spec, reference, layer, op, seed)]
            if best in disagree:
                best = next((spec for spec in perfect if spec not in disagree and spec not in recovered), reference)
        explanation = _explain(structure, measured, scores, best, by_column, by_row, others, (recovered, trees))
        if disagree:
            against, reported = (("the recovered tree", "the measured tree") if tree_best else
                                 (f"{reference}, which reproduced the op on {SETTLING_SETS} input sets,", reference))
            explanation += ("; " + ", ".join(disagree[:3]) + f" also matched both input sets, but the emulator shows "
                            f"it differs from {against} on further inputs: {reported} is reported")
        failed = [spec for spec, f in table.items() if f == 1.0 and scores[spec] < 1.0]
        if failed:
            explanation += ("; matched every output of the U[0, 1) inputs but not of the confirmation inputs: "
                            + ", ".join(f"{spec} {share_text(confirmation['fractions'][spec])}" for spec in failed[:3]))
    if trees.note.startswith(NOT_NEEDED) and best is not None and scores.get(best) == 1.0:
        explanation += f"; {trees.note}"
    if best is not None and parse_model(best).zeros == Zeros.POSITIVE:
        explanation += ("; zero results are +0: where every product is a negative tiny value the op returned +0 at "
                        "every output the spec otherwise gives -0 (the sum lands on a +0-initialised output), so the "
                        "spec says zeros=positive")
    if layer.groups > 1:
        explanation += f"; {GROUPED_NOTE}"
    fraction = 0.0 if best is None else scores.get(best, 0.0)
    return {"best": best, "fractions": {k: fraction} if best else {},
            "stops_matching_at": None if best and fraction == 1.0 else k, "perfect": perfect,
            "direct": direct.to_dict() if direct else None,
            "structure": structure.to_dict(), "trees": trees.to_dict(), "measured_specs": measured, "table": table,
            "confirmation": confirmation, "outputs_compared": len(observed), "explanation": explanation}


def _measured_candidates(layer: Layer, op: str, structure: Structure, signed_zeros: Callable[[str], str] = str):
    """(the specs of the structure measured at `layer`, those of its columns, of its rows,
    and (specs, structure, how) of each other layout it was measured in), each spec passed
    through `signed_zeros`; the earliest spec wins a tie."""
    measured, by_column, by_row = ([signed_zeros(spec) for spec in part] for part in _measured_specs(layer, op, structure))
    others = []
    for other, at, as_op, convert, how, first in _other_layouts(layer, structure):
        found, column_spec, row_specs = _measured_specs(at, as_op, other)
        converted = {spec: signed_zeros(convert(spec)) for spec in found}  # the column and row specs are among them
        specs, column_spec, row_specs = ([converted[spec] for spec in part] for part in (found, column_spec, row_specs))
        measured = [*specs, *measured] if first else [*measured, *specs]
        by_column, by_row = [*by_column, *column_spec], [*by_row, *row_specs]
        others.append((specs, other, how))
    return measured, by_column, by_row, others


def _zero_sign(layer: Layer, op: str, seed: int, bits: list[str] | None) -> Callable[[str], str]:
    """spec -> the spec with ``zeros=positive`` where the op answered the zero-sign inputs
    (`layers.op_zero_sign_inputs`) with +0 at every output where the spec gives -0 and
    agreed everywhere else: the kernel adds its sum onto a +0 output. Otherwise the spec
    itself (its zeros then show in the scores like any other bit). Skipped where the op
    returned no +0 (no spec can need it) or the document has no such outputs (older)."""
    observed = None if bits is None else np.array([int(h, 16) for h in bits], dtype=np.uint16)
    if observed is None or not (observed == 0).any():
        return str

    def adjusted(spec: str) -> str:
        predicted = _predicted(spec, layer, op, seed, "zero_sign")
        if predicted is None:
            return spec
        return replace(parse_model(spec), zeros=Zeros.POSITIVE).to_spec() if _positive_zeros(predicted, observed) else spec

    return adjusted


#: The bits of fp16's -0.
NEGATIVE_ZERO = 0x8000


def _same_arithmetic(first: str, second: str, layer: Layer, op: str, seed: int) -> bool:
    """Whether two specs give the same bits on `SAME_ARITHMETIC_SETS` further seeded
    confirmation input sets, every output compared (the emulator alone: no TensorFlow)."""
    return all(bitwise_equal(_emulated(first, layer, op, inputs), _emulated(second, layer, op, inputs)).all()
               for inputs in _further_sets(layer, op, seed))


def _further_sets(layer: Layer, op: str, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The `SAME_ARITHMETIC_SETS` further seeded confirmation input sets of the op."""
    return [op_confirmation_inputs(layer, op, seed + CONFIRMATION_SEED_STEP * number)
            for number in range(1, SAME_ARITHMETIC_SETS + 1)]


def _confirm(table: dict, layer: Layer, op: str, seed: int, bits: list[str] | None) -> dict:
    """Each spec that matched every output of the first inputs, and the `CONFIRMED_CLOSEST`
    closest, on the confirmation inputs (so the share shown for any best spec is the lower of
    the two sets):
    {"inputs", "fractions": {spec: share bitwise equal}, "outputs_compared"}. A document
    written before confirmation existed has no bits: it says so, and confirms nothing."""
    if bits is None:
        return {"inputs": None, "fractions": {}, "outputs_compared": 0,
                "note": "not confirmed: the document holds no confirmation outputs (written by an older convprobe)"}
    observed = np.array([int(h, 16) for h in bits], dtype=np.uint16)
    fractions = {}
    closest = sorted(table, key=lambda spec: -table[spec])[:CONFIRMED_CLOSEST]
    for spec in dict.fromkeys([*(spec for spec, fraction in table.items() if fraction == 1.0), *closest]):
        predicted = _predicted(spec, layer, op, seed, "confirmation")
        fractions[spec] = 0.0 if predicted is None else float(np.mean(bitwise_equal(predicted, observed)))
    return {"inputs": CONFIRMATION_INPUTS, "fractions": fractions, "outputs_compared": len(observed)}


def _other_layouts(layer: Layer, structure) -> list[tuple]:
    """(structure, layer, op, spec for this op, how, first on a tie) of each other layout the
    op was measured in: a filter gradient batch innermost (first where the B / unit / -B
    probe saw that order), an input gradient as the forward conv of dy (XLA's GEMM)."""
    out: list[tuple[Structure, Layer | None, str, Callable[[str], str], str, bool]] = []
    if structure.innermost:
        out.append((Structure(**structure.innermost), layer, "conv2d_backprop_filter", _batch_innermost,
                    "rows laid out batch innermost", bool(structure.batch_innermost)))
    if structure.as_forward:
        out.append((Structure(**structure.as_forward), forward_layer(layer), "conv2d", str,
                    "measured as the forward conv of dy with the rotated filter", False))
    return out


def _measured_specs(layer: Layer, op: str, structure) -> tuple[list[str], list[str], list[str]]:
    """(every spec the structure gives, the columns' spec if any, the rows' specs): rows
    first, then columns (one row a channel measured a mixture where they differ)."""
    measured = candidate_specs(structure, layer.k(op))
    by_columns = column_models(layer, op, [ColumnRun.from_dict(run) for run in structure.columns or ()],
                               combine=structure.total if structure.total in ("fp16", "fp32") else "fp16")
    by_column = [by_columns.to_spec()] if by_columns else []
    by_row = _row_specs(layer, op, structure, by_column or measured[:2])
    return [*by_row, *by_column, *measured], by_column, by_row


def _batch_innermost(spec: str) -> str:
    """`spec` summing a filter gradient's positions (oh, ow, n), the batch innermost."""
    return replace(parse_model(spec), positions="hwn").to_spec()


def _row_specs(layer: Layer, op: str, structure, references: list[str]) -> list[str]:
    """Where the GEMM's rows differ (`tile_patterns`), a ``rows(...)`` spec for each reference
    spec of the rows the layer's structure was measured at."""
    runs = [RowRun.from_dict(run) for run in structure.rows or ()]
    combine = structure.total if structure.total in ("fp16", "fp32") else "fp16"
    columns = [ColumnRun.from_dict(run) for run in structure.columns or ()]
    if not runs:
        return []
    if op == "conv2d_backprop_input":  # its dx pixels' models come from the columns alone
        models = [dx_row_models(layer, runs, columns, combine)]
    else:
        models = [row_models(layer, op, runs, parse_model(reference), combine) for reference in references]
    return list(dict.fromkeys(model.to_spec() for model in models if model))


def _explain(structure, measured: list[str], table: dict, best: str | None, by_column: Sequence[str] = (),
             by_row: Sequence[str] = (), others: Sequence = (), recovered: tuple = ((), None)) -> str:
    """One line: what was measured, and what was ruled out when nothing matched (`others`:
    (specs, structure, how) of the op measured in another layout; `recovered`: the tree
    specs and the `RecoveredTrees` they came from)."""
    tree_specs_tried, trees = recovered
    tree_found = "" if trees is None else (
        f"summation tree recovered from {trees.queries} crafted sums, {len(trees.classes)} class(es) of cells"
        + (f"; {trees.note}" if trees.note else "") if any(trees.classes) else trees.note)
    if best is not None and table[best] == 1.0 and best in tree_specs_tried:
        return f"{best} matches every compared output (the {tree_found})"
    if best is not None and table[best] == 1.0:
        layout = ""
        for specs, other, how in others:
            if best in specs:
                structure, layout = other, f"; {how}"
                break
        if best in by_row:
            how = f"the structure measured row by row: {len(structure.rows)} runs of rows"
        elif best in by_column:
            how = f"the structure measured column by column: {len(structure.columns)} runs of columns"
        elif best in measured and structure.accumulator:
            how = "the measured structure"
        elif best in structure.derived:
            how = "the layer's layout" + ("" if structure.accumulator else "; not measured")
        else:
            how = "a plain model"
        return f"{best} matches every compared output ({how}{layout})"
    found = (f"measured: {structure.accumulator} accumulator, lanes={structure.lanes}"
             + (f" summed in {structure.combine}" if structure.combine else "")
             + f", products {'rounded' if structure.products_rounded else 'exact'}, partial sums start at "
             f"{structure.boundaries}" + (" (summed from K-1 down; positions mirrored)" if structure.backwards else "")
             ) if structure.accumulator else f"not measured ({structure.note})"
    trees_part = f"; {tree_found}" if tree_found else ""
    return f"no model matches every output; {found}{trees_part}; best tried: {_closest(table)}"


def _closest(table: dict) -> str:
    """The three specs that matched most, with their fractions."""
    return ", ".join(f"{s} {share_text(f)}" for s, f in sorted(table.items(), key=lambda i: -i[1])[:3])


def key(layer: Layer, op: str, single: bool) -> str:
    """The op's key in the JSON's matches: the op alone for one layer, 'layer / op' for a map."""
    return op if single else f"{layer.name or layer.label} / {op}"


def identify_observed(observed: dict, extra_specs=None) -> list[tuple[Layer, str, dict]]:
    """(layer, op, {"status", "error", "summary"}) for every layer and op observed."""
    out = []
    seed = observed.get("seed", 0)
    for entry in observed.get("layers", []):
        layer = Layer.from_dict(entry["layer"])
        for op in layer.ops:
            result = entry["ops"].get(op, {"status": "failed", "error": "not run"})
            if result["status"] != "ok":
                out.append((layer, op, {"status": result["status"], "error": result.get("error"), "summary": {}}))
                continue
            at, at_op, _ = measured_form(layer, op)  # a matmul's predictions are its 1x1 conv2d's
            out.append((layer, op, {"status": "ok", "error": None,
                                    "summary": _summary(at, at_op, result, seed, extra_specs)}))
    return out


def interpret(observed: dict) -> dict:
    """The verdict row: accumulation from the measured accumulators, best specs per op."""
    # unmeasured ops, and ops that are not direct sums, say nothing
    accumulators = {r["structure"].get("accumulator") for e in observed.get("layers", [])
                    for r in e["ops"].values() if r.get("status") == "ok" and not not_direct(r)} - {None}
    accumulation = (next(iter(accumulators)) if len(accumulators) == 1 and None not in accumulators
                    else "mixed" if accumulators and None not in accumulators else "unknown")
    if accumulation == "wider than fp32":
        accumulation = "fp32"
    return {"accumulation": accumulation,
            "arithmetic": f"measured accumulators: {', '.join(sorted(map(str, accumulators)))}",
            "verdict": f"{accumulation} accumulation measured at the layers' own shapes",
            "evidence": "crafted partial-sum, lane and product probes at each layer shape, "
                        "confirmed bit for bit on seeded random inputs"}
