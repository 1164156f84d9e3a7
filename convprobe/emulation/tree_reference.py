"""The exact rational reference of `convprobe.emulation.tree`: one sum of products at a
time, every node's sum formed in Fractions and rounded straight from the definitions
(`oracle.round_value`). Slow on purpose; the fast tree is tested against it."""

from __future__ import annotations

from convprobe.emulation.oracle import Value, add_exact, multiply_exact, round_value
from convprobe.emulation.tree import Chain, Fused, Item, Tree
from convprobe.options import Zeros

__all__ = ["reduce"]


def reduce(a: list[float], b: list[float], model: Tree) -> float:
    """The tree's sum of a[k] * b[k], exactly as `Tree` defines it."""
    if len(a) != model.k or len(b) != model.k:
        raise ValueError(f"the tree sums {model.k} products; received {len(a)} and {len(b)} values")

    def rounded(v: Value, fmt) -> float:
        return round_value(v, fmt, subnormals=model.subnormals, overflow=model.overflow)

    def node_sum(values: list[Value], fmt) -> float:
        total = values[0]
        for v in values[1:]:
            total = add_exact(total, v)
        if model.addition != "exact":
            total = rounded(total, model.addition)
        return rounded(total, fmt)

    def value(item: Item) -> Value:
        if isinstance(item, int):
            p = multiply_exact(a[item], b[item])
            return p if model.product == "exact" else rounded(p, model.product)
        fmt = item.format or model.accumulator
        if isinstance(item, Chain):
            acc = value(item.items[0])
            if len(item.items) == 1:
                return node_sum([acc], fmt)
            for nxt in item.items[1:]:
                acc = node_sum([acc, value(nxt)], fmt)
            return acc
        return node_sum([value(i) for i in item.items], fmt)

    root = model.root
    assert isinstance(root, (Chain, Fused))  # (`Tree._validate` parses a text root and refuses None)
    total = rounded(value(root), model.output)
    return float(add_exact(0.0, total)) if model.zeros == Zeros.POSITIVE else total  # (landed on +0)
