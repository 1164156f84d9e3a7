"""The summation trees of a conv layer's op, recovered at the layer's own shape, and the
tree models they give identify.

Crafted rows go where `layer_patterns` places them: one GEMM column (an output channel;
an input channel for the input gradient) carries one row of terms over the other
operand's constant. Every GEMM row of that column then sums the same terms, so one call
shows how each (row, column) cell orders them. Kernels order cells differently (a tail
of rows, a block of columns), so every cell first answers the same seeded queries, placed
on terms that every row reads inside the operands; cells that answer alike form a class
(`cell_classes`). Each class's tree is recovered at one of its rows whose every term
reads inside the operands, from the class's columns there, and its formats measured
the same way (`tree_formats`). The op's model then gives each cell its class's tree:
``rows(columns(...))`` where the classes differ by row and column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from convprobe.emulation.composites import Columns, Rows
from convprobe.emulation.models import AccumulationModel, parse_model
from convprobe.emulation.tree import parse_tree, tree_text
from convprobe.identify.tree_formats import TreeFormats, measure_formats, tree_models
from convprobe.identify.tree_recovery import UNIT, NotRecovered, query_rows, recover
from convprobe.probes.layer_patterns import full_rows_and_leaves, pattern_outputs, pattern_rows
from convprobe.probes.layers import Layer, op_result_shape
from convprobe.probes.structure import Structure

__all__ = ["RecoveredTrees", "cell_classes", "recover_at_layer", "tree_specs"]

#: The longest reduction whose tree is recovered (the queries grow as K log K).
MAX_TREE_K = 16384
#: Seeded queries every cell answers, to group the cells by their order.
SIGNATURE_QUERIES = 128
#: Queries asked together when every GEMM row is read (bounds the memory of one read).
_SIGNATURE_BATCH = 16


@dataclass(frozen=True)
class RecoveredTrees:
    """Each class's tree text and formats (None: the class has no row whose every term reads
    inside the operands), which class each cell is in, as runs of GEMM rows with one class
    per column ((first row, classes)), the queries asked, and a note on what failed."""

    classes: tuple[tuple[str, TreeFormats] | None, ...] = ()
    layout: tuple[tuple[int, tuple[int, ...]], ...] = ()
    queries: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        return {"classes": [None if c is None else {"tree": c[0], "formats": c[1].to_dict()} for c in self.classes],
                "layout": [[first, list(columns)] for first, columns in self.layout],
                "queries": self.queries, "note": self.note}

    @classmethod
    def from_dict(cls, data: dict | None) -> RecoveredTrees:
        if not data:
            return cls(note="not recovered (the document predates tree recovery)")
        classes = tuple(None if c is None else (str(c["tree"]), TreeFormats.from_dict(c.get("formats")))
                        for c in data.get("classes", ()))
        layout = tuple((int(first), tuple(int(c) for c in columns)) for first, columns in data.get("layout", ()))
        return cls(classes, layout, int(data.get("queries", 0)), str(data.get("note", "")))


def _sums_at(backend, layer: Layer, op: str, row: int, carriers: list[int]) -> Callable[[np.ndarray, float], np.ndarray]:
    """A black-box sum of rows of terms: each placed in one of `carriers` (GEMM columns),
    read at GEMM row `row`."""
    capacity = pattern_rows(layer, op)[0]

    def sums(terms: np.ndarray, scale: float = 1.0) -> np.ndarray:
        calls = -(-len(terms) // len(carriers))
        slots = (np.arange(calls)[:, None] * capacity + np.asarray(carriers)[None, :]).reshape(-1)[:len(terms)]
        placed = np.zeros((calls * capacity, terms.shape[1]))
        placed[slots] = terms
        with np.errstate(over="ignore", invalid="ignore"):
            return pattern_outputs(backend, layer, op, placed, scale, rows=np.array([row]))[slots, 0]

    return sums


def cell_classes(backend, layer: Layer, op: str, seed: int = 0) -> np.ndarray:
    """The class of every (GEMM row, column) cell of `op`: cells that answer the same
    `SIGNATURE_QUERIES` seeded queries alike share one, numbered in order of first cell.
    Queries sit on terms every row reads inside the operands (all terms, and the rows that
    read every term inside, where fewer than 3 are). Raises `NotRecovered` on an answer
    that is neither the unit nor 0."""
    capacity, k = pattern_rows(layer, op)[0], layer.k(op)
    shape = op_result_shape(layer, op)
    total_rows = int(np.prod(shape)) // shape[-1]
    full, leaves = full_rows_and_leaves(layer, op)
    rows = np.arange(total_rows) if len(leaves) >= 3 else full
    leaves = leaves if len(leaves) >= 3 else np.arange(k)
    classes = np.full((total_rows, capacity), -1, np.int64)
    if k < 3:
        classes[rows] = 0
        return classes
    rng = np.random.default_rng([seed, k, 0x51C])
    queries = [tuple(int(v) for v in rng.choice(leaves, 3, replace=False)) for _ in range(SIGNATURE_QUERIES)]
    answers = []
    for start in range(0, len(queries), _SIGNATURE_BATCH):
        batch = query_rows(queries[start:start + _SIGNATURE_BATCH], k)
        with np.errstate(over="ignore", invalid="ignore"):
            got = pattern_outputs(backend, layer, op, np.repeat(batch, capacity, axis=0), 1.0, rows=rows)
        if not np.isin(got, (0.0, UNIT)).all():
            raise NotRecovered(f"a crafted sum gave {got[~np.isin(got, (0.0, UNIT))][0]!r}, neither the unit nor "
                               f"0: the op is not one summation tree with M absorbing the unit")
        answers.append((got == UNIT).reshape(len(batch), capacity, len(rows)))
    signature = np.packbits(np.concatenate(answers), axis=0)  # (bytes, columns, rows)
    keys = signature.transpose(2, 1, 0).reshape(len(rows) * capacity, -1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # classes numbered by their first cell
    classes[rows] = order[inverse.reshape(-1)].reshape(len(rows), capacity)
    return classes


def recover_at_layer(backend, layer: Layer, op: str, seed: int = 0) -> RecoveredTrees:
    """The tree of each class of cells of `op` at `layer`; never raises for a layer it
    cannot recover: the note says why."""
    capacity, why = pattern_rows(layer, op)
    k = layer.k(op)
    if not capacity:
        return RecoveredTrees(note=f"not recovered: {why}")
    if k > MAX_TREE_K:
        return RecoveredTrees(note=f"not recovered: K = {k} is above {MAX_TREE_K}")
    try:
        classes = cell_classes(backend, layer, op, seed)
    except NotRecovered as exc:
        return RecoveredTrees(note=f"not recovered: {exc}")
    full = set(full_rows_and_leaves(layer, op)[0].tolist())
    found, asked, notes = [], 0, []
    for label in range(int(classes.max()) + 1):
        rows, columns = np.nonzero(classes == label)
        counts = {}
        for row in rows[np.isin(rows, list(full))]:
            counts[int(row)] = counts.get(int(row), 0) + 1
        if not counts:
            found.append(None)
            notes.append(f"class {label} has no row whose every term reads inside the operands")
            continue
        row = max(counts, key=lambda r: (counts[r], -r))
        carriers = [int(c) for c in np.flatnonzero(classes[row] == label)]
        sums = _sums_at(backend, layer, op, row, carriers)
        try:
            tree, queries = recover(sums, k, seed)
        except NotRecovered as exc:
            return RecoveredTrees(tuple(found), _layout(classes), asked,
                                  f"not recovered at GEMM row {row}, columns {_spans(carriers)}: {exc}")
        found.append((tree_text(tree), measure_formats(sums, tree, k)))
        asked += queries
    return RecoveredTrees(tuple(found), _layout(classes), asked, "; ".join(notes))


def _layout(classes: np.ndarray) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Runs of GEMM rows with one class per column: (first row, classes)."""
    out: list[tuple[int, tuple[int, ...]]] = []
    for row, labels in enumerate(classes.tolist()):
        if not out or out[-1][1] != tuple(labels):
            out.append((row, tuple(labels)))
    return tuple(out)


def _spans(columns) -> str:
    """Columns as '0-7, 9'."""
    out, start = [], None
    for i, c in enumerate(columns):
        if start is None:
            start = c
        if i + 1 == len(columns) or columns[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c != start else str(c))
            start = None
    return ", ".join(out)


def _composed(models: dict[int, AccumulationModel], layout) -> str:
    """One spec giving each cell its class's model: a plain model, ``columns(...)`` or
    ``rows(...)`` of either. A cell of no recovered class takes the most common one."""
    counts: dict[int, int] = {}
    for _, labels in layout:
        for label in labels:
            if label in models:
                counts[label] = counts.get(label, 0) + 1
    fallback = max(counts, key=counts.get)

    def per_row(labels) -> AccumulationModel:
        chosen = [models.get(label, models[fallback]) for label in labels]
        return chosen[0] if len(set(chosen)) == 1 else Columns(models=tuple(chosen))

    runs = [(first, per_row(labels)) for first, labels in layout]
    if len({model for _, model in runs}) == 1:
        return runs[0][1].to_spec()
    per_gemm_row = []
    for (first, model), following in zip(runs, [*(f for f, _ in runs[1:]), None]):
        per_gemm_row += [model] * ((following - first) if following is not None else 1)
    return Rows(models=tuple(per_gemm_row)).to_spec()


def tree_specs(layer: Layer, op: str, trees: RecoveredTrees, structure: Structure,
               score: Callable[[str, np.ndarray], float]) -> list[str]:
    """The tree model specs to try at this op: each class's model in its measured formats
    (`tree_formats.tree_models`; where products were not measured, the one `score(spec,
    cells)` ranks first on the class's own cells, a boolean mask over the result's
    (GEMM row, column) cells), put together cell by cell; then each class's models alone."""
    if not any(trees.classes):
        return []
    shape = op_result_shape(layer, op)
    rows_total, columns = int(np.prod(shape)) // shape[-1], shape[-1]
    cells = np.full((rows_total, columns), -1)
    for (first, labels), following in zip(trees.layout, [*(f for f, _ in trees.layout[1:]), rows_total]):
        cells[first:following] = labels
    chosen, everything = {}, []
    for label, found in enumerate(trees.classes):
        if found is None:
            continue
        text, formats = found
        specs = [m.to_spec() for m in tree_models(parse_tree(text), formats, structure.accumulator)]
        everything += specs
        chosen[label] = parse_model(specs[0] if len(specs) == 1 else max(specs, key=lambda s: score(s, cells == label)))
    every_class = len(trees.classes) == 1 + max(label for _, labels in trees.layout for label in labels)
    if not chosen or not every_class:  # a class failed: its cells have no model
        return list(dict.fromkeys(everything))
    return list(dict.fromkeys([_composed(chosen, trees.layout), *everything]))
