"""Summation trees: any order in which a kernel may add K products, with a format per node.

The grammar's models (sequential, lanes, split-K, ...) name the orders that have been
seen. A `Tree` names any other: identify recovers one from the kernel itself
(`convprobe.identify.tree_recovery`), and the emulator then runs it like any model.

Nodes:

* `Chain` - a left fold, ``round(...round(round(i0 + i1) + i2)... + in)``: one rounding
  per addition. A chain of one item is a lone rounding of that item (a kernel whose
  accumulator starts at +0 rounds its first product by itself).
* `Fused` - the exact sum of its items, rounded once (a multi-term adder).

Every item is a leaf (the index k of a product) or a node. A node rounds to its own
format where it names one, else to the model's accumulator; `addition`, where set, is a
first rounding of every node's sum (CPU half arithmetic: add in fp32, round to fp16).
Products are rounded to `product` first, the root to `output` last.

Text form (`Tree.to_spec`, `parse_tree`): ``tree(ROOT, accumulator=fp16, product=fp16,
output=fp16)`` where a chain is ``(ITEMS)``, a fused node ``{ITEMS}``, either followed by
``@FORMAT`` for its own format, items separated by spaces, and ``a..b`` or ``a..b/s`` is a
run of leaves a, a+s, ... b (s > 0; a > b counts down) inside a node. ``((0) 1..99)`` is a
sequential sum of 100 products from +0.

The exact rational reference is `convprobe.emulation.tree_reference`.
"""

from __future__ import annotations

import functools

import re
from dataclasses import dataclass, field
from typing import ClassVar, Union

import numpy as np

from convprobe.emulation import plan
from convprobe.emulation.composites import split_arguments
from convprobe.emulation.models import AccumulationModel, Exact, as_format
from convprobe.emulation.rounding import resolve_format, round_to_format
from convprobe.errors import InvalidArgument, invalid_choice, set_once
from convprobe.formats import Format
from convprobe.options import Positions, Rounding, Zeros

__all__ = ["Chain", "Fused", "Tree", "parse_tree", "parse_tree_model", "tree_text", "leaves_of"]


@dataclass(frozen=True)
class Chain:
    """A left fold of its items, one rounding per addition."""

    items: tuple["Item", ...]
    format: Format | None = None


@dataclass(frozen=True)
class Fused:
    """The exact sum of its items, rounded once."""

    items: tuple["Item", ...]
    format: Format | None = None


Node = Union[Chain, Fused]
Item = Union[int, Chain, Fused]


def leaves_of(item: Item) -> list[int]:
    """The leaves under `item`, left to right."""
    if isinstance(item, int):
        return [item]
    out: list[int] = []
    stack: list[Item] = [item]
    while stack:
        top = stack.pop()
        if isinstance(top, int):
            out.append(top)
        else:
            stack.extend(reversed(top.items))
    return out


# -- text ----------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<open>[({])|(?P<close>[)}])|(?P<run>\d+\s*\.\.\s*\d+(?:\s*/\s*\d+)?)"
                    r"|(?P<leaf>\d+)|@(?P<format>[A-Za-z0-9_]+))")


def parse_tree(text: str) -> Node:
    """The node `text` writes (module docstring); one clear error for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument(f"a tree must be a chain '(...)' or a fused node '{{...}}'; received {text!r}")
    tokens: list[tuple[str, str]] = []
    at = 0
    text = text.strip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if not match or match.end() == at:
            raise InvalidArgument(f"tree text has an unexpected character at {at}: {text[at:at + 20]!r}; "
                                  f"allowed: ( ) {{ }} leaves, a..b[/s] runs and @FORMAT")
        group = match.lastgroup
        assert group is not None  # (a match that moved on matched one of the named groups)
        tokens.append((group, match.group(group)))
        at = match.end()
    stack: list[tuple[str, list[Item]]] = []
    root: Node | None = None
    for i, (kind, value) in enumerate(tokens):
        if kind == "open":
            stack.append((value, []))
        elif kind == "close":
            if not stack or {"(": ")", "{": "}"}[stack[-1][0]] != value:
                raise InvalidArgument(f"tree text has an unbalanced {value!r}")
            opener, items = stack.pop()
            if not items:
                raise InvalidArgument("a tree node needs at least one item; received an empty one")
            fmt: Format | None = None
            if i + 1 < len(tokens) and tokens[i + 1][0] == "format":
                fmt = resolve_format(tokens[i + 1][1], "tree node format")
            node = (Chain if opener == "(" else Fused)(tuple(items), fmt)
            if stack:
                stack[-1][1].append(node)
            elif root is None:
                root = node
            else:
                raise InvalidArgument("tree text holds more than one root node")
        elif kind == "format":
            if i == 0 or tokens[i - 1][0] != "close":
                raise InvalidArgument("@FORMAT must follow a node's closing bracket")
        else:
            if not stack:
                raise InvalidArgument("tree leaves must sit inside a node: write (0 1 2), not 0 1 2")
            stack[-1][1].extend(_run(value) if kind == "run" else [int(value)])
    if stack or root is None:
        raise InvalidArgument("tree text has an unclosed node")
    return root


def _run(text: str) -> list[int]:
    bounds, _, step_text = text.replace(" ", "").partition("/")
    first, last = (int(v) for v in bounds.split(".."))
    step = int(step_text or 1)
    if step < 1:
        raise InvalidArgument(f"a run's step must be a positive integer; received {text!r}")
    if (abs(last - first)) % step:
        raise InvalidArgument(f"a run must end on its step: {text!r}")
    return list(range(first, last + 1, step)) if last >= first else list(range(first, last - 1, -step))


def _step(items: list[Item], i: int) -> int | None:
    """items[i + 1] - items[i] where both are leaves, else None."""
    left, right = items[i], items[i + 1]
    return right - left if isinstance(left, int) and isinstance(right, int) else None


def tree_text(item: Item) -> str:
    """The text `parse_tree` reads back, runs of evenly spaced leaves written a..b/s."""
    if isinstance(item, int):
        return str(item)
    parts: list[str] = []
    items = list(item.items)
    i = 0
    while i < len(items):
        j = i
        step = _step(items, i) if i + 1 < len(items) else None
        if step is not None:
            while j + 1 < len(items) and step != 0 and _step(items, j) == step:
                j += 1
        if j - i >= 2 and step is not None:
            s = abs(step)
            parts.append(f"{items[i]}..{items[j]}" + (f"/{s}" if s != 1 else ""))
            i = j + 1
        else:
            parts.append(tree_text(items[i]))
            i += 1
    open_, close = ("(", ")") if isinstance(item, Chain) else ("{", "}")
    return open_ + " ".join(parts) + close + (f"@{item.format.name}" if item.format else "")


# -- the model -----------------------------------------------------------------------

@dataclass(frozen=True)
class Tree(AccumulationModel):
    """K products summed in the order of `root`, a `Chain` or `Fused` node over leaves
    0..K-1 (module docstring); K is the tree's, and a GEMM of another K is refused."""

    root: Node | str | None = field(default=None, kw_only=True)

    kind: ClassVar[str] = "tree"

    def _validate(self) -> None:
        root = parse_tree(self.root) if isinstance(self.root, str) else self.root
        if not isinstance(root, (Chain, Fused)):
            raise InvalidArgument(f"a tree model needs root=, a chain '(...)' or a fused node '{{...}}'; "
                                  f"received {self.root!r}")
        leaves = leaves_of(root)
        if sorted(leaves) != list(range(len(leaves))):
            counts = np.bincount(np.asarray(leaves, np.int64)) if min(leaves) >= 0 else np.zeros(0)
            doubled = [int(k) for k in np.flatnonzero(counts > 1)]
            missing = sorted(set(range(max(leaves) + 1)) - set(leaves))[:5]
            raise InvalidArgument(f"a tree's leaves must be 0..K-1, each once; repeated {doubled[:5]}, "
                                  f"missing {missing}")
        if self.rounding != Rounding.NEAREST_EVEN:
            raise InvalidArgument(f"a tree model rounds to nearest even; received rounding={self.rounding}")
        if self.positions != Positions.NHW:
            raise InvalidArgument("a tree model's leaves are the op's K order; positions cannot be set")
        self._set("root", root)

    @property
    def _root(self) -> Node:
        """`root` as read after construction (`_validate` parses text and refuses None)."""
        assert isinstance(self.root, (Chain, Fused))
        return self.root

    @functools.cached_property
    def k(self) -> int:
        """The number of products the tree sums (counted once: kernels ask it per call)."""
        return len(leaves_of(self._root))

    @property
    def name(self) -> str:
        return self.to_spec()

    def to_spec(self) -> str:
        parts = [tree_text(self._root), f"accumulator={as_format(self.accumulator).name}"]
        for key in ("product", "addition"):
            value = getattr(self, key)
            if value != "exact":
                parts.append(f"{key}={value.name}")
        if self.output != self.accumulator:
            parts.append(f"output={as_format(self.output).name}")
        if self.subnormals != "keep":
            parts.append(f"subnormals={self.subnormals}")
        if self.overflow != "inf":
            parts.append(f"overflow={self.overflow}")
        if self.zeros != Zeros.SIGNED:
            parts.append(f"zeros={self.zeros}")
        return f"tree({', '.join(parts)})"

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["root"] = tree_text(self._root)
        return out

    def _describe_kind(self) -> str:
        return (f"a summation tree over {self.k} products (chains fold, fused nodes round once), "
                f"nodes rounded to {self.accumulator} unless they name a format")

    def carrier(self, inputs_fp16: bool) -> type:
        return np.float32 if inputs_fp16 and self.plannable() else np.float64

    def _plan_probe_k(self) -> int:
        return self.k

    def program(self, k: int) -> plan.Program:
        self._check_k(k)
        return super().program(k)

    def emit(self, steps, items, register):
        """Depth first: a node's value in register d, a node item's in d + 1; leaf i is
        `items[i]`. A fused sum of more than two items has no program."""
        def node(item: Item, at: int) -> None:
            if isinstance(item, int):
                steps.take(self, at, items[item])
                return
            if isinstance(item, Fused) and len(item.items) > 2:
                raise plan.NotPlannable("a fused sum of more than two items")
            first, *rest = item.items
            node(first, at)
            if not rest:
                steps.round(self, at, item.format)
            for nxt in rest:
                if isinstance(nxt, int):
                    steps.add(self, at, items[nxt], item.format)
                else:
                    node(nxt, at + 1)
                    steps.combine(self, at, at + 1, item.format)

        node(self._root, register)
        steps.round(self, register, self.output)

    def _round(self, values: np.ndarray, fmt: Format) -> np.ndarray:
        return round_to_format(values, fmt, Rounding.NEAREST_EVEN, subnormals=self.subnormals,
                               overflow=self.overflow)

    def _node_sum(self, values: list[np.ndarray], node: Node) -> np.ndarray:
        """One node's addition of `values`: the exact sum rounded (to `addition` first, if set)."""
        fmt = node.format or as_format(self.accumulator)
        first = self.addition if isinstance(self.addition, Format) else fmt  # (else "exact")
        if len(values) <= 2 and first.precision <= 25:
            # values of at most 25 bits: float64 rounds their sum at most once, harmlessly
            total = self._round(values[0] if len(values) == 1 else values[0] + values[1], first)
        else:
            exact = Exact(first, subnormals=self.subnormals, overflow=self.overflow)
            total = exact.sum_terms(np.stack([v.reshape(-1) for v in values])).reshape(values[0].shape)
        return total if first == fmt else self._round(total, fmt)

    def _evaluate(self, leaf) -> np.ndarray:
        """The root's value, `leaf(k)` giving product k (already rounded to `product`)."""
        def value(item: Item) -> np.ndarray:
            if isinstance(item, int):
                return leaf(item)
            if isinstance(item, Fused):
                return self._node_sum([value(i) for i in item.items], item)
            acc = value(item.items[0])
            if len(item.items) == 1:
                return self._node_sum([acc], item)
            for nxt in item.items[1:]:
                acc = self._node_sum([acc, value(nxt)], item)
            return acc

        return self._round(value(self._root), as_format(self.output))

    def _check_k(self, k: int) -> None:
        if k != self.k:
            raise InvalidArgument(f"this tree sums {self.k} products; the reduction has K = {k}")

    def _products(self, a: np.ndarray, b: np.ndarray):
        """leaf(k) for products a[..., k] * b[..., k] (broadcast), rounded to `product`."""
        def leaf(k: int) -> np.ndarray:
            p = a[k] * b[k]
            return self._round(p, self.product) if isinstance(self.product, Format) else p  # (else "exact")
        return leaf

    def reduce_rows(self, a, b, c):
        if c is not None:
            raise InvalidArgument("c (an accumulator input) is not defined for tree models")
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        self._check_k(a.shape[1])
        with np.errstate(invalid="ignore", over="ignore"):
            return self._evaluate(self._products(a.T, b.T))

    def gemm_into(self, a, w, out, col0, inputs_fp16):
        self._check_k(a.shape[1])
        if a.dtype == np.float32:
            plan.run(self.program(a.shape[1]), a, w, out, col0)
            return
        a64, w64 = np.asarray(a, np.float64), np.asarray(w, np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            result = self._evaluate(self._products(a64.T[:, :, None], w64[:, None, :]))
        out[:, col0:col0 + w.shape[1]] = result

    def sum_terms(self, terms: np.ndarray) -> np.ndarray:
        terms = np.asarray(terms, np.float64)
        return self.reduce_rows(terms.T, np.ones_like(terms.T), None)


def parse_tree_model(spec: str) -> Tree:
    """``tree(ROOT[, KEY=VALUE]...)`` (module docstring) as a `Tree`."""
    body = spec.strip()
    if not body.lower().startswith("tree(") or not body.endswith(")"):
        raise InvalidArgument(f"a tree spec is tree(ROOT, accumulator=FORMAT, ...); received {spec!r}")
    args = split_arguments(body[len("tree("):-1])
    if not args:
        raise InvalidArgument("a tree spec needs its root: tree((0 1 2), accumulator=fp32)")
    allowed = ("accumulator", "product", "addition", "output", "subnormals", "overflow", "zeros")
    kwargs: dict = {"root": args[0]}
    for arg in args[1:]:
        key, sep, value = arg.partition("=")
        key = {"acc": "accumulator", "out": "output"}.get(key.strip().lower(), key.strip().lower())
        if not sep or key not in allowed:
            raise invalid_choice("tree model parameter", arg, allowed)
        set_once(kwargs, key, value.strip(), f"tree spec {spec!r}")
    return Tree(**kwargs)

