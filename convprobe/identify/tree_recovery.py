"""Recover the summation tree of a black-box sum from crafted inputs, whatever its shape.

The method follows FPRev (Xie, Gao, Wang, Xue, "Revealing Floating-Point Accumulation
Orders in Software/Hardware Implementations", USENIX ATC'25): a large +M and -M cancel
exactly where their partial sums meet, and a small unit survives only if it joins after
that. convprobe asks one bit per sum instead of counting units (fp16 operands give M / u
at most 2**30, too little to keep thousands of units below M's rounding in an fp32
accumulator), and asks many sums in one call of the op (`sums`).

A query (i, j, k) puts +M at leaf i, -M at leaf j and a unit at leaf k, zeros elsewhere:
the unit survives exactly when k lies outside the subtree where i and j meet. Fixing i,
the leaves are ordered by how far up i's path they join it; that order is sorted by a
quicksort whose comparisons, two queries each, are all asked together round by round.
Leaves that join i's path at one node are split again from a pivot of their own, and a
last query with a unit from i's own side tells whether they form one subtree or several
inputs of a multi-term (fused) adder.

Every answer must be exactly the unit or zero, and the finished tree must predict fresh
seeded queries: anything else is reported as not recovered, with the reason. Terms that
survive on both sides of a pivot (an exact multi-term sum, or an accumulator wider than
fp32, where M does not absorb the unit) are reported too: their order cannot show.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any

import numpy as np

from convprobe.emulation.tree import Chain, Fused, Item, leaves_of

__all__ = ["BIG", "UNIT", "NotRecovered", "recover", "query_rows", "predicted", "as_query"]

#: +-M: exactly representable in fp16 and far above the unit in fp16 and fp32 accumulators.
BIG = 2.0 ** 14
#: The unit: a normal fp16 number that M absorbs in fp16 and fp32 (ulp(2**14) / 2 >= 2**-10).
UNIT = 2.0 ** -14
#: Fresh queries the recovered tree must predict.
CHECKS = 256

Query = tuple[int, int, int]
Asking = Generator[list[Query], list[bool], object]


class NotRecovered(Exception):
    """The sums do not behave as one summation tree; the message says what was seen."""


def query_rows(queries: list[Query], k: int) -> np.ndarray:
    """The crafted rows of `queries`: +M at i, -M at j, the unit at k."""
    rows = np.zeros((len(queries), k))
    for r, (i, j, unit) in enumerate(queries):
        rows[r, i], rows[r, j], rows[r, unit] = BIG, -BIG, UNIT
    return rows


def recover(sums: Callable[[np.ndarray], np.ndarray], k: int, seed: int = 0,
            leaves: list[int] | None = None) -> tuple[Item, int]:
    """(the summation tree of a sum of `k` terms, queries asked); `sums(rows)` returns the
    black box's sum of each row of terms (fp16 values). With `leaves`, only those terms are
    ordered (the others stay zero: a border output that reads padding there) and the tree
    holds only them. Raises `NotRecovered`."""
    if leaves is not None:
        chosen = np.asarray(sorted(leaves), np.int64)

        def on_chosen(rows: np.ndarray) -> np.ndarray:
            full = np.zeros((len(rows), k))
            full[:, chosen] = rows
            return sums(full)

        tree, asked = recover(on_chosen, len(chosen), seed)
        return _renumbered(tree, chosen), asked
    asked = 0

    def ask(queries: list[Query]) -> list[bool]:
        nonlocal asked
        if not queries:
            return []
        asked += len(queries)
        got = np.asarray(sums(query_rows(queries, k)), np.float64)
        wrong = ~((got == UNIT) | (got == 0))
        if wrong.any():
            r = int(np.flatnonzero(wrong)[0])
            raise NotRecovered(f"a crafted sum (+M at {queries[r][0]}, -M at {queries[r][1]}, a unit at "
                               f"{queries[r][2]}) gave {got[r]!r}, neither the unit nor 0: the op is not one "
                               f"summation tree with M absorbing the unit")
        return list(got == UNIT)

    if k == 1:
        return Chain((0,)), 0
    tree = _drive(_subtree(0, list(range(1, k))), ask)
    _check(tree, k, ask, seed)
    return tree, asked


def _renumbered(item: Item, names: np.ndarray) -> Item:
    if isinstance(item, int):
        return int(names[item])
    return type(item)(tuple(_renumbered(i, names) for i in item.items), item.format)


def _drive(gen: Asking, ask: Callable[[list[Query]], list[bool]]):
    try:
        queries = next(gen)
        while True:
            queries = gen.send(ask(queries))
    except StopIteration as stop:
        return stop.value


def _together(gens: list[Asking]) -> Generator[list[Query], list[bool], list]:
    """Run several askers in lockstep, their queries of a round asked as one batch."""
    results: list = [None] * len(gens)
    pending: dict[int, list[Query]] = {}
    for n, gen in enumerate(gens):
        try:
            pending[n] = next(gen)
        except StopIteration as stop:
            results[n] = stop.value
    while pending:
        batch = [q for qs in pending.values() for q in qs]
        answers = yield batch
        at, following = 0, {}
        for n, qs in pending.items():
            part, at = answers[at:at + len(qs)], at + len(qs)
            try:
                following[n] = gens[n].send(part)
            except StopIteration as stop:
                results[n] = stop.value
        pending = following
    return results


def _levels(i: int, members: list[int]) -> Generator[list[Query], list[bool], list[list[int]]]:
    """`members` grouped by where they join leaf i's path, lowest first (a 3-way quicksort,
    every segment partitioned in the same round)."""
    parts: list[tuple[bool, list[int]]] = [(False, list(members))] if members else []
    while any(not done for done, _ in parts):
        queries, plans = [], []
        for done, segment in parts:
            if done or len(segment) == 1:
                continue
            pivot = segment[len(segment) // 2]
            others = [e for e in segment if e != pivot]
            plans.append((pivot, others))
            queries += [q for e in others for q in ((i, pivot, e), (i, e, pivot))]
        answers = yield queries
        results = iter(answers)
        outcome = {}
        for pivot, others in plans:
            lower: list[int] = []
            higher: list[int] = []
            same = [pivot]
            for e in others:
                above, below = next(results), next(results)
                if above and below:
                    raise NotRecovered(f"with +M at {i}, terms {pivot} and {e} each survive the other's -M: an "
                                       f"exact multi-term sum or an accumulator wider than fp32, whose order "
                                       f"cannot show")
                (higher if above else lower if below else same).append(e)
            outcome[pivot] = [(False, lower), (True, sorted(same)), (False, higher)]
        following = []
        for done, segment in parts:
            if done or len(segment) == 1:
                following.append((True, segment))
            else:
                following += [(d, s) for d, s in outcome[segment[len(segment) // 2]] if s]
        parts = following
    return [segment for _, segment in parts]


def _subtree(i: int, members: list[int]) -> Generator[list[Query], list[bool], Item]:
    """The subtree holding leaf i and exactly `members` besides."""
    levels = yield from _levels(i, members)
    return (yield from _assemble(i, levels))


def _assemble(i: int, levels: list[list[int]]) -> Generator[list[Query], list[bool], Item]:
    """Leaf i joined, level by level, by what joins its path there."""
    forests = yield from _together([_forest(group, i) for group in levels])
    node: Item = i
    for forest in forests:
        node = _join(node, forest[0]) if len(forest) == 1 else Fused((node, *forest))
    return node


def _forest(group: list[int], inside: int) -> Generator[list[Query], list[bool], list[Item]]:
    """The subtrees that `group` forms where it joins a node; `inside` is a leaf of that
    node on the other side (the unit that tells one subtree from several fused inputs)."""
    if len(group) == 1:
        return [group[0]]
    i, rest = group[0], group[1:]
    levels = yield from _levels(i, rest)
    (kept,) = yield [(i, levels[-1][0], inside)]
    if kept:  # i meets the top level below the node: the group is one subtree
        return [(yield from _assemble(i, levels))]
    own = yield from _assemble(i, levels[:-1])
    return [own, *(yield from _forest(levels[-1], inside))]


def _join(left: Item, right: Item) -> Item:
    """The binary node left + right, extending a chain where one side is one."""
    for a, b in ((left, right), (right, left)):
        if isinstance(a, Chain) and a.format is None and len(a.items) > 1:
            if not (isinstance(b, Chain) and len(b.items) > len(a.items)):
                return Chain((*a.items, b))
    return Chain((left, right))


def as_query(values: Iterable[Any]) -> Query:
    """A query from three integers (NumPy's or Python's)."""
    first, second, third = (int(v) for v in values)
    return first, second, third


def predicted(tree: Item, queries: list[Query]) -> list[bool]:
    """Whether each query's unit survives in `tree` (units at a fused node with M are lost,
    as a multi-term adder that aligns to its largest term loses them)."""
    parent: dict[int, int] = {}
    leaf_parent: dict[int, int] = {}
    sizes: list[int] = []

    def walk(item: Item, up: int) -> None:
        if isinstance(item, int):
            leaf_parent[item] = up
            return
        if isinstance(item, Chain) and len(item.items) > 2:  # a fold: nested binary nodes
            node = up
            for depth in range(len(item.items) - 1, 0, -1):
                me = len(sizes)
                sizes.append(0)
                parent[me] = node
                walk(item.items[depth], me)
                node = me
            walk(item.items[0], node)
            return
        me = len(sizes)
        sizes.append(0)
        parent[me] = up
        for child in item.items:
            walk(child, me)

    walk(tree, -1)

    paths: dict[int, tuple[list[int], set[int]]] = {}

    def path(leaf: int) -> tuple[list[int], set[int]]:
        """The nodes above `leaf`, lowest first, and as a set (each leaf's worked out once)."""
        if leaf not in paths:
            out, node = [], leaf_parent[leaf]
            while node != -1:
                out.append(node)
                node = parent[node]
            paths[leaf] = (out, set(out))
        return paths[leaf]

    answers = []
    for i, j, unit in queries:
        above_j = path(j)[1]
        meet = next(n for n in path(i)[0] if n in above_j)
        answers.append(meet not in path(unit)[1])
    return answers


def _check(tree: Item, k: int, ask, seed: int) -> None:
    """The tree must predict `CHECKS` fresh seeded queries."""
    if sorted(leaves_of(tree)) != list(range(k)):
        raise NotRecovered("the recovered tree does not hold every term once")
    if k < 3:
        return
    rng = np.random.default_rng([seed, k, 0x7EE])
    queries = [as_query(rng.choice(k, 3, replace=False)) for _ in range(CHECKS)]
    got = ask(queries)
    wrong = [q for q, g, p in zip(queries, got, predicted(tree, queries)) if g != p]
    if wrong:
        raise NotRecovered(f"the recovered tree mispredicts {len(wrong)} of {len(queries)} fresh crafted sums "
                           f"(first: +M at {wrong[0][0]}, -M at {wrong[0][1]}, a unit at {wrong[0][2]})")
