"""The summation tree of a conv layer's op, recovered at the layer's own shape, and the
tree models it gives identify.

Crafted rows go where `layer_patterns` places them: one GEMM column (an output channel;
an input channel for the input gradient) carries one row, read at an output whose window
lies inside the image. Kernels may order different columns differently, so every column
first answers the same seeded queries; columns that answer alike form a class, and each
class's tree is recovered from its own columns alone (`order_classes`).

The formats come from the structure measured beside the tree (accumulator, rounded
products, additions in fp32), per run of columns where `column_patterns` measured them;
whether a chain's first product is rounded alone (an accumulator that starts at +0) is
tried both ways where it can matter, and each group of columns takes the variant that
matches its own columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from convprobe.emulation.composites import Columns
from convprobe.emulation.models import parse_model
from convprobe.emulation.tree import parse_tree, tree_text
from convprobe.identify.tree_formats import TreeFormats, measure_formats, tree_models
from convprobe.identify.tree_recovery import UNIT, NotRecovered, query_rows, recover
from convprobe.probes.layer_patterns import pattern_outputs, pattern_rows
from convprobe.probes.layers import Layer
from convprobe.probes.structure import Structure

__all__ = ["RecoveredTrees", "order_classes", "recover_at_layer", "tree_specs"]

#: The longest reduction whose tree is recovered (the queries grow as K log K).
MAX_TREE_K = 16384
#: Seeded queries every column answers, to group the columns by their order.
SIGNATURE_QUERIES = 128


@dataclass(frozen=True)
class RecoveredTrees:
    """Per class of GEMM columns that order their sums alike, the columns and the tree text;
    or the note saying why not."""

    runs: tuple[tuple[tuple[int, ...], str, TreeFormats], ...] = ()
    queries: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        return {"runs": [{"columns": list(columns), "tree": text, "formats": formats.to_dict()}
                         for columns, text, formats in self.runs],
                "queries": self.queries, "note": self.note}

    @classmethod
    def from_dict(cls, data: dict | None) -> RecoveredTrees:
        if not data:
            return cls(note="not recovered (the document predates tree recovery)")
        return cls(tuple((tuple(int(c) for c in run["columns"]), str(run["tree"]), TreeFormats.from_dict(run.get("formats")))
                         for run in data.get("runs", ())),
                   int(data.get("queries", 0)), str(data.get("note", "")))


def _placed_outputs(backend, layer: Layer, op: str, rows: np.ndarray, slots: np.ndarray, calls: int,
                    scale: float = 1.0) -> np.ndarray:
    """The op's sums of `rows`, row r placed in GEMM column slots[r] % capacity of call
    slots[r] // capacity (`layer_patterns`: one row a column, zeros elsewhere; the terms
    are the operands rows / scale times the constant scale)."""
    capacity = pattern_rows(layer, op)[0]
    placed = np.zeros((calls * capacity, rows.shape[1]))
    placed[slots] = rows
    with np.errstate(over="ignore", invalid="ignore"):
        return pattern_outputs(backend, layer, op, placed, scale)[slots]


def _sums_in(backend, layer: Layer, op: str, carriers: list[int]) -> Callable[[np.ndarray, float], np.ndarray]:
    """A black-box sum of rows that places each row in one of `carriers` (GEMM columns)."""
    capacity = pattern_rows(layer, op)[0]

    def sums(rows: np.ndarray, scale: float = 1.0) -> np.ndarray:
        calls = -(-len(rows) // len(carriers))
        slots = (np.arange(calls)[:, None] * capacity + np.asarray(carriers)[None, :]).reshape(-1)[:len(rows)]
        return _placed_outputs(backend, layer, op, rows, slots, calls, scale)

    return sums


def order_classes(backend, layer: Layer, op: str, seed: int = 0) -> list[tuple[int, ...]]:
    """The GEMM columns grouped by how they order their sums: every column answers the same
    `SIGNATURE_QUERIES` seeded queries, and columns with equal answers form one class (in
    the order of their first column). Raises `NotRecovered` on an answer that is neither
    the unit nor 0."""
    capacity, k = pattern_rows(layer, op)[0], layer.k(op)
    if k < 3:
        return [tuple(range(capacity))]
    rng = np.random.default_rng([seed, k, 0x51C])
    queries = [tuple(int(v) for v in rng.choice(k, 3, replace=False)) for _ in range(SIGNATURE_QUERIES)]
    rows = np.repeat(query_rows(queries, k), capacity, axis=0)
    got = _placed_outputs(backend, layer, op, rows, np.arange(len(rows)), len(queries)).reshape(len(queries), capacity)
    if not np.isin(got, (0.0, UNIT)).all():
        raise NotRecovered(f"a crafted sum gave {got[~np.isin(got, (0.0, UNIT))][0]!r}, neither the unit nor 0: the "
                           f"op is not one summation tree with M absorbing the unit")
    classes: dict[bytes, list[int]] = {}
    for column in range(capacity):
        classes.setdefault(got[:, column].tobytes(), []).append(column)
    return [tuple(columns) for columns in classes.values()]


def recover_at_layer(backend, layer: Layer, op: str, seed: int = 0) -> RecoveredTrees:
    """The tree of each class of columns of `op` at `layer`; never raises for a layer it
    cannot recover: the note says why."""
    capacity, why = pattern_rows(layer, op)
    k = layer.k(op)
    if not capacity:
        return RecoveredTrees(note=f"not recovered: {why}")
    if k > MAX_TREE_K:
        return RecoveredTrees(note=f"not recovered: K = {k} is above {MAX_TREE_K}")
    runs, asked = [], 0
    try:
        classes = order_classes(backend, layer, op, seed)
    except NotRecovered as exc:
        return RecoveredTrees(note=f"not recovered: {exc}")
    for columns in classes:
        sums = _sums_in(backend, layer, op, list(columns))
        try:
            tree, queries = recover(sums, k, seed)
        except NotRecovered as exc:
            return RecoveredTrees(tuple(runs), asked, f"not recovered at columns {_spans(columns)}: {exc}")
        runs.append((columns, tree_text(tree), measure_formats(sums, tree, k)))
        asked += queries
    return RecoveredTrees(tuple(runs), asked)


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


def tree_specs(layer: Layer, op: str, trees: RecoveredTrees, structure: Structure,
               score: Callable[[str, np.ndarray], float]) -> list[str]:
    """The tree model specs to try at this op: each class's models in its measured formats
    (`tree_formats.tree_models`; the op's measured accumulator where no chain showed one).
    Where there are several classes, each takes the model that `score(spec, columns)` (the
    share matched on its own output channels) ranks first, put together by column."""
    if not trees.runs or trees.note:
        return []
    capacity = pattern_rows(layer, op)[0]
    per_column: list[str] = [""] * capacity
    everything: list[str] = []
    for columns, text, formats in trees.runs:
        specs = [model.to_spec() for model in tree_models(parse_tree(text), formats, structure.accumulator)]
        everything += specs
        best = specs[0] if len(trees.runs) == 1 else max(specs, key=lambda spec: score(spec, np.asarray(columns)))
        for column in columns:
            per_column[column] = best
    if len(trees.runs) == 1:
        return everything
    models = {spec: parse_model(spec) for spec in dict.fromkeys(per_column)}
    return list(dict.fromkeys([Columns(models=tuple(models[spec] for spec in per_column)).to_spec(), *everything]))
