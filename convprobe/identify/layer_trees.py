"""The summation trees of a conv layer's op, recovered at the layer's own shape, and the
tree models they give identify.

Crafted rows go where `layer_patterns` places them: one GEMM column (an output channel;
an input channel for the input gradient) carries one row of terms over the other
operand's constant. Every GEMM row of that column then sums the same terms, so one call
shows how each (row, column) cell orders and rounds them. Kernels differ by cell (a tail
of rows, a block of columns), so the rows are grouped by the terms they read inside the
operands (`row_groups`: a border row reads padding), and every cell of a group reads the
same seeded signature rows on its terms: order queries, and rows that show formats.
Cells that read them alike form a class. A class whose whole signature a model found
already predicts takes that model; otherwise its tree is recovered at one of its rows
(or, where a known order predicts its queries, that order pruned to the row's terms), and
its formats are measured there (`tree_formats`). The op's model then gives each cell its
class's tree: ``rows(columns(...))`` where the classes differ by row and column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from convprobe.emulation.composites import Columns, Rows
from convprobe.emulation.models import AccumulationModel
from convprobe.emulation.reduction import dot
from convprobe.emulation.specs import parse_model
from convprobe.emulation.tree import Chain, Item, Tree, leaves_of, parse_tree, tree_text
from convprobe.identify.tree_formats import COARSE, FINE, KEPT, SCALE, TreeFormats, measure_formats, terms_row, tree_models
from convprobe.identify.tree_recovery import UNIT, NotRecovered, as_query, predicted, query_rows, recover
from convprobe.identify.layer_patterns import pattern_columns, pattern_outputs, row_groups
from convprobe.probes.layers import Layer, op_result_shape
from convprobe.identify.structure import Structure

__all__ = ["RecoveredTrees", "recover_at_layer", "tree_specs"]

#: The longest reduction whose tree is recovered (the queries grow as K log K).
MAX_TREE_K = 16384
#: Seeded queries every cell answers, to group the cells by their order.
SIGNATURE_QUERIES = 64
#: Queries asked together when every GEMM row is read (bounds the memory of one read).
_SIGNATURE_BATCH = 16
#: Seeded rows of each kind that show formats in every cell's signature.
_FORMAT_ROWS = 8


@dataclass(frozen=True)
class RecoveredTrees:
    """Each class's tree text and formats, which class each cell is in, as runs of GEMM rows
    with one class per column ((first row, classes); -1: not classed), the queries asked,
    and a note on what failed."""

    classes: tuple[tuple[str, TreeFormats], ...] = ()
    layout: tuple[tuple[int, tuple[int, ...]], ...] = ()
    queries: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        return {"classes": [{"tree": text, "formats": formats.to_dict()} for text, formats in self.classes],
                "layout": [[first, list(columns)] for first, columns in self.layout],
                "queries": self.queries, "note": self.note}

    @classmethod
    def from_dict(cls, data: dict | None) -> RecoveredTrees:
        if not data:
            return cls(note="not recovered (the document predates tree recovery)")
        classes = tuple((str(c["tree"]), TreeFormats.from_dict(c.get("formats"))) for c in data.get("classes", ()))
        layout = tuple((int(first), tuple(int(c) for c in columns)) for first, columns in data.get("layout", ()))
        return cls(classes, layout, int(data.get("queries", 0)), str(data.get("note", "")))


class _Sums(Protocol):
    """A black-box sum of rows of terms, the fp16 operands formed as terms / scale."""

    def __call__(self, terms: np.ndarray, scale: float = 1.0) -> np.ndarray: ...


def _sums_at(backend, layer: Layer, op: str, row: int, carriers: list[int]) -> _Sums:
    """A black-box sum of rows of terms: each placed in one of `carriers` (GEMM columns),
    read at GEMM row `row`."""
    capacity = pattern_columns(layer, op)

    def sums(terms: np.ndarray, scale: float = 1.0) -> np.ndarray:
        calls = -(-len(terms) // len(carriers))
        slots = (np.arange(calls)[:, None] * capacity + np.asarray(carriers)[None, :]).reshape(-1)[:len(terms)]
        placed = np.zeros((calls * capacity, terms.shape[1]))
        placed[slots] = terms
        with np.errstate(over="ignore", invalid="ignore"):
            return pattern_outputs(backend, layer, op, placed, scale, rows=np.array([row]))[slots, 0]

    return sums


@dataclass(frozen=True)
class _Class:
    """Cells of one group of rows that read their signature rows alike: the group's terms,
    the order queries, every signature row with its reading (at scale 1
    and at `SCALE`), and the cells ((row, column) pairs)."""

    leaves: np.ndarray
    queries: list
    rows: tuple[np.ndarray, np.ndarray]
    readings: tuple[np.ndarray, np.ndarray]
    cells: list

    @property
    def answers(self) -> tuple[bool, ...]:
        """Whether the unit survived each order query (the first readings at scale 1)."""
        return tuple((self.readings[0][:len(self.queries)] == UNIT).tolist())

    def predicted_by(self, model) -> bool:
        """Whether `model` (an emulator model) reads every signature row as these cells did."""
        for rows, reading, scale in zip(self.rows, self.readings, (1.0, SCALE)):
            if not len(rows):
                continue
            operands = (rows / scale).astype(np.float16)
            with np.errstate(over="ignore", invalid="ignore"):  # (dot: the model's compiled program where it has one)
                got = np.asarray(dot(operands, np.full(operands.shape[-1], scale, np.float16), model),
                                 np.float16).astype(np.float64)
            if not np.array_equal(got, reading, equal_nan=True):
                return False
        return True


def _read_all(backend, layer: Layer, op: str, terms: np.ndarray, scale: float, rows: np.ndarray) -> np.ndarray:
    """Each row of terms carried by every column at once, read at `rows`: (terms, columns, rows)."""
    capacity = pattern_columns(layer, op)
    out = []
    for start in range(0, len(terms), _SIGNATURE_BATCH):
        batch = terms[start:start + _SIGNATURE_BATCH]
        with np.errstate(over="ignore", invalid="ignore"):
            got = pattern_outputs(backend, layer, op, np.repeat(batch, capacity, axis=0), scale, rows=rows)
        out.append(got.reshape(len(batch), capacity, len(rows)))
    return np.concatenate(out) if out else np.zeros((0, capacity, len(rows)))


def _format_rows(leaves: np.ndarray, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Seeded rows whose sums show formats rather than order (`tree_formats`' readings):
    (rows at scale 1: 1, 2**-12 and -1; rows at scale s: s**2 and -s, and 2050 and
    1 - 2**-20). Half are at random terms, half at neighbouring ones: random terms mostly
    meet across a stored partial sum, whose rounding hides how the products were rounded
    (cells that round them differently would otherwise read alike)."""
    unit, scaled = [], []
    for number in range(2 * _FORMAT_ROWS):
        if number % 2:
            start = int(rng.integers(max(len(leaves) - 2, 1)))
            picked = [int(v) for v in leaves[start:start + 3]]
        else:
            picked = [int(v) for v in rng.choice(leaves, min(3, len(leaves)), replace=False)]
        if len(picked) >= 3:
            a, b, c = picked
            unit.append(terms_row(k, {a: 1.0, b: KEPT, c: -1.0}))
        for a, b in (picked[:2], picked[1::-1]):  # both orders: which of the two is rounded alone
            scaled.append(terms_row(k, {a: SCALE * SCALE, b: -SCALE}))
            scaled.append(terms_row(k, {a: COARSE, b: FINE}))
    return np.asarray(unit).reshape(-1, k), np.asarray(scaled)


def _signature_classes(backend, layer: Layer, op: str, seed: int) -> list[_Class]:
    """Every cell's answers to seeded rows on the terms its rows read inside the operands
    (`row_groups`): order queries (three terms or more) and rows that show formats. Cells
    of one group that answer alike form one class. Raises `NotRecovered` on an order
    answer that is neither the unit nor 0."""
    capacity, k = pattern_columns(layer, op), layer.k(op)
    out = []
    for number, (leaves, rows) in enumerate(row_groups(layer, op)):
        if len(leaves) < min(k, 3):
            continue
        rng = np.random.default_rng([seed, k, number, 0x51C])
        queries = ([as_query(rng.choice(leaves, 3, replace=False)) for _ in range(SIGNATURE_QUERIES)]
                   if len(leaves) >= 3 else [])
        order = _read_all(backend, layer, op, query_rows(queries, k), 1.0, rows)
        if not np.isin(order, (0.0, UNIT)).all():
            raise NotRecovered(f"a crafted sum gave {order[~np.isin(order, (0.0, UNIT))][0]!r}, neither the unit "
                               f"nor 0: the op is not one summation tree with M absorbing the unit")
        unit_rows, scaled_rows = _format_rows(leaves, k, rng)
        unit_rows = np.concatenate([query_rows(queries, k), unit_rows])
        unit_read = np.concatenate([order, _read_all(backend, layer, op, unit_rows[len(queries):], 1.0, rows)])
        scaled_read = _read_all(backend, layer, op, scaled_rows, SCALE, rows)
        found: dict[bytes, _Class] = {}
        for column in range(capacity):
            for r, row in enumerate(rows.tolist()):
                key = unit_read[:, column, r].tobytes() + scaled_read[:, column, r].tobytes()
                if key not in found:
                    found[key] = _Class(leaves, queries, (unit_rows, scaled_rows),
                                        (unit_read[:, column, r], scaled_read[:, column, r]), [])
                found[key].cells.append((row, column))
        out += list(found.values())
    return out


def recover_at_layer(backend, layer: Layer, op: str, seed: int = 0) -> RecoveredTrees:
    """The trees of `op` at `layer`, and which cell takes which; never raises for a layer it
    cannot recover: the note says why. A class whose order answers a tree found already
    predicts takes that tree; any other is recovered at one of its rows, over the terms
    that row reads inside the operands (a border row's tree is then completed with its
    padding's zeros, `_completed`). Every class's formats are measured at its own cells."""
    capacity, k = pattern_columns(layer, op), layer.k(op)
    if k > MAX_TREE_K:
        return RecoveredTrees(note=f"not recovered: K = {k} is above {MAX_TREE_K}")
    try:
        classes = _signature_classes(backend, layer, op, seed)
    except NotRecovered as exc:
        return RecoveredTrees(note=f"not recovered: {exc}")
    shape = op_result_shape(layer, op)
    labels = np.full((int(np.prod(shape)) // shape[-1], capacity), -1, np.int64)
    found: list[tuple[str, TreeFormats]] = []
    models: list[list[Tree]] = []
    roots: list[Item] = []
    asked = 0
    for group in classes:
        label = next((n for n, variants in enumerate(models) if any(group.predicted_by(m) for m in variants)), None)
        if label is None:
            row = group.cells[0][0]
            carriers = sorted(column for r, column in group.cells if r == row)
            sums = _sums_at(backend, layer, op, row, carriers)
            known = Chain(tuple(range(k))) if k < 3 else next(
                (root for root in roots if tuple(predicted(root, group.queries)) == group.answers), None)
            if known is not None:
                tree = _pruned(known, set(group.leaves.tolist()))
            else:
                leaves = None if len(group.leaves) == k else group.leaves.tolist()
                try:
                    tree, queries = recover(sums, k, seed, leaves)
                except NotRecovered as exc:
                    return RecoveredTrees(tuple(found), _layout(labels), asked,
                                          f"not recovered at GEMM row {row}, columns {_spans(carriers)}: {exc}")
                asked += queries
                roots.append(_completed(tree, k))
            formats = measure_formats(sums, tree, k)
            label = len(found)
            found.append((tree_text(tree), formats))
            models.append(tree_models(_completed(tree, k), formats))
        for cell_row, column in group.cells:
            labels[cell_row, column] = label
    note = "" if (labels >= 0).all() else "some cells read fewer than 3 terms inside the operands: not recovered"
    return RecoveredTrees(tuple(found), _layout(labels), asked, note)


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
    fallback = max(counts, key=lambda label: counts[label])

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


def _pruned(item: Item, keep: set[int]) -> Item:
    """`item` over the terms in `keep` only (a border row's terms): folds lose the others,
    and a fold left with one item is that item."""
    if isinstance(item, int):
        return item
    items = [_pruned(i, keep) for i in item.items if set(leaves_of(i)) & keep]
    if len(items) == 1 and not isinstance(items[0], int):
        return items[0]
    return type(item)(tuple(items), item.format)


def _completed(root: Item, k: int) -> Item:
    """A tree recovered at a border row (over the terms it reads in bounds) with the other
    terms, zeros there, added last to its root's fold, in the fold's last format: +0
    changes no value."""
    missing = sorted(set(range(k)) - set(leaves_of(root)))
    if not missing:
        return root
    return Chain((*root.items, *missing), root.format) if isinstance(root, Chain) else Chain((root, *missing))


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
    for label, (text, formats) in enumerate(trees.classes):
        root = _completed(parse_tree(text), layer.k(op))
        specs = [m.to_spec() for m in tree_models(root, formats, structure.accumulator)]
        everything += specs
        chosen[label] = parse_model(specs[0] if len(specs) == 1 else max(specs, key=lambda s: score(s, cells == label)))
    every_class = len(trees.classes) == 1 + max(label for _, labels in trees.layout for label in labels)
    if not chosen or not every_class:  # a class failed: its cells have no model
        return list(dict.fromkeys(everything))
    return list(dict.fromkeys([_composed(chosen, trees.layout), *everything]))
