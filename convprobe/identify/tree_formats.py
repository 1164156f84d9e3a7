"""The formats at a recovered summation tree's nodes, measured with crafted sums through
the same op.

A fold (chain) of items i0, i1, ... computes, at each step t, the sum of the value so
far and item t. Three roundings can happen there, and each is measured on its own:

- **the step's rounding** (fp16 or wider): 2050 at item t-1 and 1 - 2**-20 at item t (a
  product, operands 2048 and 1 - 2**-10 times s = 1 + 2**-10). Rounded to fp16 at once
  the sum is 2050; rounded to fp32 first it is the tie 2051, which fp16 later sends to 2052.
  Where item t is a partial sum, 1 - 2**-20 sits at its first leaf, and the reading is used
  only where products are exact and the value reached the step intact: every fold on the
  way from the item down to that leaf keeps fp32 and is not rounded alone as it joins, and
  the leaf's product is not rounded alone (else it arrives as 1 and an fp16 step reads as
  fp32). A per-sample sum added in fp32 to a result stored in fp16 is rounded twice; 1 sum
  in a few thousand shows it.
- **the value kept for the next step** (fp16 or fp32): 1 at item t-1, 2**-12 at item t
  and -1 at item t+1 (for a chain's last step, at the item that meets the chain in its
  parent chain). Kept in fp32, 1 + 2**-12 leaves 2**-12; stored in fp16 it leaves 0. A step
  rounded wider but kept in fp16 is an fp32 addition stored to fp16 (CPU half arithmetic,
  or a block's partial sum written to an fp16 buffer).
- **an item rounded alone before it joins**: a partial sum (1 and 2**-12 inside it)
  meeting -1 at the step that adds it leaves 2**-12 unless it was first rounded to fp16;
  a product (s**2, operand s) meeting -s from the item before it (or, the first, after
  it) leaves 2**-10 + 2**-20 if exact and 2**-10 if rounded to fp16 first: a fold that
  starts at +0 rounds its first product alone, a scalar tail loop each of its products.
  Every product rounded means the products are.

A test is placed only where its values reach the output intact; an untested step takes
its neighbour's format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from convprobe.emulation.tree import Chain, Item, Tree, leaves_of
from convprobe.formats import FP16, FP32

__all__ = ["ChainFormats", "TreeFormats", "measure_formats", "tree_models", "chains_of", "terms_row", "SCALE", "FINE",
           "COARSE", "KEPT"]

#: The constant operand of the tests that need inexact products.
SCALE = 1.0 + 2.0 ** -10
FINE = (1 - 2.0 ** -10) * SCALE  # the product 1 - 2**-20
COARSE = 2048 * SCALE  # the product 2050
KEPT = 2.0 ** -12
_FORMATS = {"fp16": FP16, "fp32": FP32}


@dataclass(frozen=True)
class ChainFormats:
    """One chain's measurements; None where a test could not be placed or did not decide."""

    steps: tuple[str | None, ...] = ()  # step t (1..n-1) rounds to: "fp16" or "fp32"
    kept: tuple[str | None, ...] = ()  # the value after step t, as the next step sees it
    alone: tuple[bool | None, ...] = ()  # item t (0..n-1) rounded to fp16 alone before it joins

    def to_dict(self) -> dict:
        return {"steps": list(self.steps), "kept": list(self.kept), "alone": list(self.alone)}


@dataclass(frozen=True)
class TreeFormats:
    """Per chain (depth first from the root) its `ChainFormats`, whether every product is
    rounded to fp16, and notes on what could not be measured."""

    chains: tuple[ChainFormats, ...] = ()
    products_rounded: bool | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"chains": [c.to_dict() for c in self.chains], "products_rounded": self.products_rounded,
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: dict | None) -> TreeFormats:
        data = data or {}
        chains = tuple(ChainFormats(tuple(c["steps"]), tuple(c["kept"]), tuple(c["alone"]))
                       for c in data.get("chains", ()))
        return cls(chains, data.get("products_rounded"), tuple(data.get("notes", ())))


def chains_of(root: Item) -> list[Chain]:
    """The chains of the tree, depth first from the root."""
    out: list[Chain] = []
    stack: list[Item] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, int):
            continue
        if isinstance(item, Chain):
            out.append(item)
        stack.extend(reversed(item.items))
    return out


def _first(item: Item) -> int:
    return leaves_of(item)[0]


def _first_path(item: Item) -> list[Item]:
    """`item`, its first item, that item's first item, ... down to its first leaf."""
    path = [item]
    while not isinstance(last := path[-1], int):
        path.append(last.items[0])
    return path


def terms_row(k: int, values: dict[int, float]) -> np.ndarray:
    """A row of k terms: `values` at their leaves, zeros elsewhere."""
    row = np.zeros(k)
    for leaf, value in values.items():
        row[leaf] = value
    return row


class _Plan:
    """Rows to ask, each with where its answer goes."""

    def __init__(self, k: int):
        self.k = k
        self.rows: list[np.ndarray] = []
        self.keys: list[tuple[str, int, int]] = []

    def add(self, key: tuple[str, int, int], values: dict[int, float]) -> None:
        self.rows.append(terms_row(self.k, values))
        self.keys.append(key)

    def ask(self, sums, scale: float) -> dict[tuple[str, int, int], float]:
        if not self.rows:
            return {}
        return {key: float(v) for key, v in zip(self.keys, sums(np.stack(self.rows), scale))}


def measure_formats(sums: Callable[[np.ndarray, float], np.ndarray], root: Item, k: int) -> TreeFormats:
    """The formats of `root`'s additions (module docstring); `sums(rows, scale)` returns the
    op's sums of rows of terms formed as fp16 operands (terms / scale) times `scale`."""
    chains = chains_of(root)
    # a chain's last step is seen where the chain joins its parent chain: -1 from the item
    # before it there (or, for the parent's first item, the item after)
    partner = {id(item): _first(parent.items[j - 1] if j else parent.items[1])
               for parent in chains if len(parent.items) > 1
               for j, item in enumerate(parent.items) if isinstance(item, Chain)}
    unit, scaled = _Plan(k), _Plan(k)
    for n, chain in enumerate(chains):
        items = chain.items
        for t in range(1, len(items)):
            after = _first(items[t + 1]) if t + 1 < len(items) else partner.get(id(chain))
            if after is not None:
                unit.add(("kept", n, t), {_first(items[t - 1]): 1.0, _first(items[t]): KEPT, after: -1.0})
            step_item = items[t]
            if isinstance(step_item, int):
                scaled.add(("step", n, t), {_first(items[t - 1]): COARSE, step_item: FINE})
        for t, item in enumerate(items):  # each product: rounded alone before its step, or not
            if isinstance(item, int) and len(items) > 1:
                scaled.add(("product", n, t), {item: SCALE * SCALE, _first(items[t - 1] if t else items[1]): -SCALE})
    got = {**unit.ask(sums, 1.0), **scaled.ask(sums, SCALE)}
    exact_sum, rounded_sum = 2.0 ** -10 + 2.0 ** -20, 2.0 ** -10
    readings = [v for key, v in got.items() if key[0] == "product"]
    products_rounded = (True if readings and all(v == rounded_sum for v in readings)
                        else False if exact_sum in readings else None)
    notes = [] if readings else ["no product joins a fold with another item: product rounding not measured"]
    kept_of = {key[1:]: {KEPT: "fp32", 0.0: "fp16"}.get(v) for key, v in got.items() if key[0] == "kept"}
    # second pass: partial sums that join a chain, where their own folds keep fp32 (so a
    # value placed at their first leaf reaches the join intact): rounded alone to fp16 before
    # they join, or not; and, where products are exact, the step that adds them
    joins, join_steps, index = _Plan(k), _Plan(k), {id(c): n for n, c in enumerate(chains)}

    def keeps_fp32(item: Item) -> bool:
        """A partial sum whose fold keeps its first step in fp32 and no step in fp16."""
        own = index.get(id(item))
        return (isinstance(item, Chain) and own is not None and kept_of.get((own, 1)) == "fp32"
                and all(kept_of.get((own, s)) != "fp16" for s in range(2, len(item.items))))

    needs: dict[tuple[str, int, int], list[tuple[tuple[str, int, int], float]]] = {}
    for n, chain in enumerate(chains):
        for t, item in enumerate(chain.items):
            other = chain.items[t - 1] if t else (chain.items[1] if len(chain.items) > 1 else None)
            if other is None or not isinstance(item, Chain) or not keeps_fp32(item):
                continue
            joins.add(("alone", n, t), {_first(item.items[0]): 1.0, _first(item.items[1]): KEPT, _first(other): -1.0})
            path = _first_path(item)  # the item, its first item, ... its first leaf
            if t and products_rounded is False and all(keeps_fp32(c) for c in path[:-1]):
                # 1 - 2**-20 reaches the step only if no fold on the way rounds it to fp16: each
                # nested sum not rounded alone as it joins, the leaf's product not rounded alone
                needs[("step", n, t)] = (
                    [(("alone", n, t), KEPT)]
                    + [(("alone", index[id(parent)], 0), KEPT) for parent in path[:-2]]
                    + [(("product", index[id(path[-2])], 0), exact_sum)])
                join_steps.add(("step", n, t), {_first(other): COARSE, _first(item): FINE})
    got.update(joins.ask(sums, 1.0))
    steps_read = join_steps.ask(sums, SCALE)  # (a value rounded to fp16 on its way reads as fp32: kept only where none is)
    got.update({key: value for key, value in steps_read.items()
                if all(got.get(test) == reading for test, reading in needs[key])})
    out = []
    step_formats: dict[float | None, str] = {2050.0: "fp16", 2052.0: "fp32"}
    alone_readings: dict[float | None, bool] = {KEPT: False, 0.0: True}
    for n, chain in enumerate(chains):
        steps = [step_formats.get(got.get(("step", n, t)))
                 if products_rounded is False else None for t in range(1, len(chain.items))]
        kept = tuple(kept_of.get((n, t)) for t in range(1, len(chain.items)))
        alone = [alone_readings.get(got.get(("alone", n, t))) for t in range(len(chain.items))]
        for t in range(len(chain.items)):
            if ("product", n, t) in got and products_rounded is False:
                alone[t] = {rounded_sum: True, exact_sum: False}.get(got[("product", n, t)])
                if alone[t] and t:  # its step test read a rounded product, not the step
                    steps[t - 1] = None
        out.append(ChainFormats(tuple(steps), kept, tuple(alone)))
    return TreeFormats(tuple(out), products_rounded, tuple(notes))


def _fold(chain: Chain, formats: ChainFormats, accumulator: str, addition: bool, build) -> Item:
    """One chain as nested folds: a run of steps with one format is one fold; a value stored
    to fp16 after a wider step closes its fold in a lone fp16 rounding; an item rounded alone
    is wrapped in one (a fold's first product: written first), and so is a whole fold whose
    sum is stored to fp16 as it joins its parent."""
    items = [build(i) for i in chain.items]
    alone = list(formats.alone) + [None] * (len(items) - len(formats.alone))
    items = [Chain((item,), FP16) if alone[t] else item for t, item in enumerate(items)]
    if len(items) == 1:
        return items[0] if isinstance(items[0], Chain) else Chain((items[0],))
    rounding, stores, last = [], [], accumulator
    for t in range(1, len(items)):
        step = formats.steps[t - 1] if t - 1 < len(formats.steps) else None
        kept = formats.kept[t - 1] if t - 1 < len(formats.kept) else None
        step = step or kept or last
        if addition:  # every fold adds in fp32 and keeps fp16: the model's addition says so
            step = "fp16" if step == "fp32" and kept in ("fp16", None) else step
        rounding.append(step)
        stores.append(step == "fp32" and kept == "fp16")
        last = step
    run, fmt = [items[0]], rounding[0]
    for t in range(1, len(items)):
        if rounding[t - 1] != fmt:
            run, fmt = [_close(run, fmt, accumulator)], rounding[t - 1]
        run.append(items[t])
        if stores[t - 1] and t + 1 < len(items):
            run, fmt = [Chain((_close(run, fmt, accumulator),), FP16)], rounding[t] if t < len(rounding) else fmt
    closed = _close(run, fmt, accumulator)  # a sum stored to fp16 as it joins its parent (a chunk's fp16 buffer)
    return Chain((closed,), FP16) if stores[-1] and fmt != "fp16" else closed


def _close(run: list[Item], fmt: str, accumulator: str) -> Chain:
    return Chain(tuple(run), None if fmt == accumulator else _FORMATS[fmt])


def _adds_in_fp32(formats: TreeFormats) -> bool:
    """Whether every measured step rounds wider and keeps fp16: an fp16 accumulator whose
    additions are done in fp32 (the model's ``addition=fp32``)."""
    pairs = [(s, k) for c in formats.chains for s, k in zip(c.steps, c.kept) if s and k]
    return bool(pairs) and all(p == ("fp32", "fp16") for p in pairs)


def tree_models(root: Item, formats: TreeFormats, fallback_accumulator: str | None = None) -> list[Tree]:
    """The tree model the measured formats give (two, with and without rounded products,
    where that was not measured): the most common format the values are kept in is the
    accumulator, other formats are written on their folds."""
    chains = chains_of(root)
    if len(formats.chains) != len(chains):
        formats = TreeFormats(tuple(ChainFormats() for _ in chains), formats.products_rounded, formats.notes)
    index = {id(c): n for n, c in enumerate(chains)}
    kept = [f for c in formats.chains for f in c.kept if f] or [f for c in formats.chains for f in c.steps if f]
    accumulator = (max(("fp16", "fp32"), key=kept.count) if kept
                   else fallback_accumulator if fallback_accumulator in ("fp16", "fp32") else "fp32")
    addition = _adds_in_fp32(formats)

    def build(item: Item) -> Item:
        if isinstance(item, int):
            return item
        if isinstance(item, Chain):
            return _fold(item, formats.chains[index[id(item)]], accumulator, addition, build)
        return type(item)(tuple(build(i) for i in item.items), item.format)

    tree_root = build(root)
    by_rounding: dict[bool | None, list[str]] = {True: ["fp16"], False: ["exact"]}
    products = by_rounding.get(formats.products_rounded, ["exact", "fp16"])
    return [Tree(accumulator, product=product, addition="fp32" if addition else "exact", output="fp16",
                 root=tree_root)  # type: ignore[arg-type]  # (a lone leaf, an int: Tree refuses it)
            for product in products]
