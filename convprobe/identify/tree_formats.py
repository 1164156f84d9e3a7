"""The formats at a recovered summation tree's nodes, measured with crafted sums through
the same op: which format each fold (chain) rounds to, whether products are rounded,
whether an fp16 fold adds in fp32 first, and whether it rounds its first product alone.

Each test puts a few values at chosen leaves, zeros elsewhere, and reads the op's
output (s = 1 + 2**-10, the constant operand where a test needs inexact products):

- **chain format**, per chain of three or more items: 1, 2**-12 and -1 at a leaf of its
  first three items. A chain that keeps fp32 leaves 2**-12; an fp16 one rounds 1 + 2**-12
  to 1 and leaves 0.
- **products**, at a chain's first two leaves: -s and s**2 (operands -1 and s). An exact
  product leaves 2**-10 + 2**-20; one rounded to fp16 leaves 2**-10.
- **additions in fp32** (fp16 chains, exact products): 2048 s = 2050 then 1 - 2**-20
  (operands 2048 and 1 - 2**-10). One fp16 rounding gives 2050; fp32 first rounds onto
  the tie 2051, which fp16 sends to 2052.
- **first product alone**: the same two terms the other way round. Rounded alone first,
  1 - 2**-20 becomes 1 and the sum ties to 2052; in one rounding it is 2050.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from convprobe.emulation.tree import Chain, Item, Tree, leaves_of
from convprobe.formats import FP16, FP32

__all__ = ["TreeFormats", "measure_formats", "tree_models", "SCALE"]

#: The constant operand of the tests that need inexact products.
SCALE = 1.0 + 2.0 ** -10


@dataclass(frozen=True)
class TreeFormats:
    """What the tests showed; None where a test could not be placed or did not decide."""

    chains: tuple[str | None, ...] = ()  # per chain, depth-first: "fp16", "fp32" or None
    products_rounded: bool | None = None
    additions_in_fp32: bool | None = None
    first_alone: bool | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"chains": list(self.chains), "products_rounded": self.products_rounded,
                "additions_in_fp32": self.additions_in_fp32, "first_alone": self.first_alone,
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: dict | None) -> TreeFormats:
        data = data or {}
        return cls(tuple(data.get("chains", ())), data.get("products_rounded"), data.get("additions_in_fp32"),
                   data.get("first_alone"), tuple(data.get("notes", ())))


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


def _leading_leaves(root: Item) -> tuple[int, int] | None:
    """The first two items of the first chain that opens on two leaves."""
    return next(((c.items[0], c.items[1]) for c in chains_of(root)
                 if len(c.items) > 1 and isinstance(c.items[0], int) and isinstance(c.items[1], int)), None)


def _row(k: int, values: dict[int, float]) -> np.ndarray:
    row = np.zeros(k)
    for leaf, value in values.items():
        row[leaf] = value
    return row


def measure_formats(sums: Callable[[np.ndarray, float], np.ndarray], root: Item, k: int) -> TreeFormats:
    """The formats of `root`'s nodes; `sums(rows, scale)` returns the op's sums of rows of
    terms formed as fp16 operands (terms / scale) times the constant `scale`."""
    notes = []
    chains = chains_of(root)
    tested = [c for c in chains if len(c.items) >= 3]
    rows = [_row(k, {leaves_of(c.items[0])[0]: 1.0, leaves_of(c.items[1])[0]: 2.0 ** -12,
                     leaves_of(c.items[2])[0]: -1.0}) for c in tested]
    by_chain = {}
    if rows:
        got = sums(np.stack(rows), 1.0)
        by_chain = {id(c): {2.0 ** -12: "fp32", 0.0: "fp16"}.get(float(v)) for c, v in zip(tested, got)}
    chain_formats = tuple(by_chain.get(id(c)) for c in chains)
    pair = _leading_leaves(root)
    if pair is None:
        notes.append("no chain opens on two products: product rounding and fp32 additions not measured")
        return TreeFormats(chain_formats, notes=tuple(notes))
    first, second = pair
    s = SCALE
    product_row = _row(k, {first: -s, second: s * s})
    add_row = _row(k, {first: 2048 * s, second: (1 - 2.0 ** -10) * s})
    alone_row = _row(k, {first: (1 - 2.0 ** -10) * s, second: 2048 * s})
    product, added, alone = (float(v) for v in sums(np.stack([product_row, add_row, alone_row]), s))
    rounded = {2.0 ** -10 + 2.0 ** -20: False, 2.0 ** -10: True}.get(product)
    if rounded is None:
        notes.append(f"the product test gave {product!r}, neither 2**-10 + 2**-20 nor 2**-10")
    in_fp32 = first_alone = None
    if rounded is False and all(f == "fp16" for f in chain_formats if f is not None) and any(chain_formats):
        in_fp32 = {2050.0: False, 2052.0: True}.get(added)
        if in_fp32 is False:
            first_alone = {2050.0: False, 2052.0: True}.get(alone)
    return TreeFormats(chain_formats, rounded, in_fp32, first_alone, tuple(notes))


def _starting_at_zero(item: Item) -> Item:
    """`item` with every chain that opens on a product rounding it alone first (+0 + p)."""
    if isinstance(item, int):
        return item
    items = tuple(_starting_at_zero(i) for i in item.items)
    if isinstance(item, Chain) and isinstance(items[0], int) and len(items) > 1:
        items = (Chain((items[0],)), *items[1:])
    return type(item)(items, item.format)


def _with_chain_formats(item: Item, formats: dict[int, str], default: str, chains: list[Chain]) -> Item:
    """`item` with each measured chain's format written on it where it is not `default`."""
    index = {id(c): n for n, c in enumerate(chains)}

    def walk(node: Item) -> Item:
        if isinstance(node, int):
            return node
        items = tuple(walk(i) for i in node.items)
        own = formats.get(index.get(id(node), -1)) if isinstance(node, Chain) else None
        fmt = {"fp16": FP16, "fp32": FP32}[own] if own and own != default else node.format
        return type(node)(items, fmt)

    return walk(item)


def tree_models(root: Item, formats: TreeFormats, fallback_accumulator: str | None = None) -> list[Tree]:
    """The tree models the measured formats give (a few where a test did not decide): the
    root chain's format (else the most common measured one) is the accumulator, other
    chains that differ carry their own."""
    chains = chains_of(root)
    measured = {n: f for n, f in enumerate(formats.chains) if f is not None}
    if measured.get(0):
        accumulators = [measured[0]]
    elif measured:
        values = list(measured.values())
        accumulators = [max(("fp16", "fp32"), key=values.count)]
    else:
        accumulators = [fallback_accumulator] if fallback_accumulator in ("fp16", "fp32") else ["fp32", "fp16"]
    products = {True: ["fp16"], False: ["exact"]}.get(formats.products_rounded, ["exact", "fp16"])
    out = []
    for accumulator in accumulators:
        tree_root = _with_chain_formats(root, measured, accumulator, chains)
        for product in products:
            fp16_exact = product == "exact" and (accumulator == "fp16" or "fp16" in measured.values())
            additions = {True: ["fp32"], False: ["exact"]}.get(formats.additions_in_fp32,
                                                               ["exact", "fp32"] if fp16_exact else ["exact"])
            alone = {True: [True], False: [False]}.get(formats.first_alone, [False, True] if fp16_exact else [False])
            for addition in additions:
                for start in alone:
                    r = _starting_at_zero(tree_root) if start else tree_root
                    out.append(Tree(accumulator, product=product, addition=addition, output="fp16", root=r))
    return list(dict.fromkeys(out))
