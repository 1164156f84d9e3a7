"""The emulator models a measured structure names: a crafted-row `Structure` (accumulator,
chunk starts, lanes, product rounding, totals) in, model values out, the measured product
rounding first. Where the measurement leaves a choice that is cheap to confirm or rule out
(the order lanes are combined in, a tree of chunk sums, the totals' other format), every
reading is offered; identify's confirmation decides. Specs are written only at the edge
(`candidate_specs`, for the tables and the JSON)."""

from __future__ import annotations

from dataclasses import replace

from convprobe.emulation import AccumulationModel, Chunked, Exact, Pairwise, Sequential, parse_model
from convprobe.emulation.composites import Lanes, Reverse, SplitK
from convprobe.identify.structure import Structure, grids

__all__ = ["candidate_models", "candidate_specs", "halving"]


def halving(width: int, fmt: str = "fp32", output: str = "fp16") -> AccumulationModel:
    """The usual SIMD horizontal sum of `width` lanes: lane i + lane i + width/2, halving
    until one is left (Eigen's `predux`), in `fmt`, the result rounded to `output`.
    `width` must be a power of two."""
    if width < 1 or width & (width - 1):
        raise ValueError(f"the halving tree needs a power-of-two width; received {width}")
    if width <= 2:
        return Sequential(fmt, output=output if output != fmt else None)
    return Lanes(width=width // 2, inner=Sequential(fmt), combine=halving(width // 2, fmt, output))


def candidate_specs(structure: Structure, k: int) -> list[str]:
    """`candidate_models` as canonical specs, each once."""
    return list(dict.fromkeys(model.to_spec() for model in candidate_models(structure, k)))


def candidate_models(structure: Structure, k: int) -> list[AccumulationModel]:
    """Models with the measured structure; where it fits no chunk or split grid (or nothing
    was measured), the models derived from the op's layout (`Structure.derived`)."""
    if structure.backwards:
        return [Reverse(inner=model) for model in candidate_models(replace(structure, backwards=False), k)]
    acc = structure.accumulator
    if acc == "wider than fp32":
        return [Exact("fp64", output="fp16"), Sequential("fp64", output="fp16")]
    if structure.combine is not None:
        return _wide_lane_models(structure, k)
    bounds = structure.boundaries or []
    fit = grids(bounds, k, structure.lanes or 1)
    if fit is None and bounds and bounds[0] >= 16 and all(b % bounds[0] == 0 for b in bounds):
        fit = None, bounds[0]  # a tree of chunk sums hides the starts of chunks it pairs first
    if acc is None or structure.lanes is None or fit is None:
        return [parse_model(spec) for spec in structure.derived]
    outer, n = fit
    lanes = structure.lanes
    # the measured product rounding first; the other is cheap to confirm or rule out
    exact, rounded = ("exact", "exact"), ("fp16", "exact")  # (product, addition)
    steps = [exact, rounded] if structure.products_rounded is False else [rounded, exact]
    if structure.additions_in_fp32:  # exact products, each addition rounded to fp32 then fp16
        steps = [("exact", "fp32"), *steps]
    total = structure.total or acc
    output = None if acc == total == "fp16" else "fp16"
    models: list[AccumulationModel] = []
    trees: list[AccumulationModel] = []
    for product, addition in steps:
        inner = Sequential(acc, product=product, addition=addition)
        # the combined sum enters the tail as a product: only where the product format holds it
        tail = structure.lanes_tail if structure.lanes_tail and (acc == "fp16" or product == "exact") else 0
        bodies: list[AccumulationModel] = [inner] if lanes == 1 else [
            Lanes(width=lanes, inner=inner, combine=order(acc), tail=tail) for order in (Sequential, Pairwise)]
        for body in bodies:
            model: AccumulationModel
            if n is not None and outer is None and lanes == 1:
                model = Chunked(acc, chunk=n, total=total, product=product, addition=addition)
            elif n is not None:
                model = SplitK(total, inner=body, length=n)
            else:
                model = body
            if outer is not None:
                model = SplitK(total, inner=model, length=outer)
            if n is not None and outer is None:  # the chunk sums in a tree instead of in order
                trees.append(SplitK(inner=body, length=n, combine=Pairwise(total), output=output))
                # threads' halves or quarters at chunk multiples: the starts are the same
                trees += [SplitK(total, inner=model, length=k // parts, output=output)
                          for parts in (2, 4) if k % (parts * n) == 0 and k // parts > n]
            models.append(replace(model, output=output) if output else model)
    if acc == "fp16" and n is not None and outer is None:  # the other total format: cheap to rule out
        models += [_other_total(model, total) for model in models]
    return models + trees


def _wide_lane_models(structure: Structure, k: int) -> list[AccumulationModel]:
    """Narrow lanes summed wide: each of the lane's own models in W lanes, combined by the
    halving tree, in order or pairwise in the wide format, rounded to fp16."""
    width, wide = structure.lanes, structure.combine
    if width is None or wide is None or structure.boundaries is None:  # (wide: the caller's test)
        return [parse_model(spec) for spec in structure.derived]
    lane = Structure(structure.accumulator, [b // width for b in structure.boundaries], 1,
                     structure.products_rounded, additions_in_fp32=structure.additions_in_fp32,
                     total=structure.total)
    combines: list[AccumulationModel] = [Sequential(wide, output="fp16"), Pairwise(wide, output="fp16")]
    if width & (width - 1) == 0:
        combines.insert(0, halving(width, wide))
    # lanes folded last to first in the lane format also keep a lone unit outside B's lane
    narrow = structure.accumulator or "fp16"
    combines += [Reverse(inner=Sequential(narrow)), Reverse(inner=Sequential(narrow, addition="fp32"))]
    return [Lanes(width=width, inner=inner, combine=combine)
            for inner in candidate_models(lane, -(-k // width)) for combine in combines]


def _other_total(model: AccumulationModel, total: str) -> AccumulationModel:
    """An fp16-accumulator chunk model with its totals in the other format (fp16 <-> fp32)."""
    other = "fp32" if total == "fp16" else "fp16"
    if isinstance(model, Chunked):
        return replace(model, total=other)
    return replace(model, accumulator=other, output="fp16" if other == "fp32" else None)
