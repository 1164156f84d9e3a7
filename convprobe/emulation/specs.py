"""The spec grammar: one string for any accumulation model, parsed into a model object.

Strings are for the edges (the command line, files, result documents); inside, models
are values. `parse_model` reads every form: the plain kinds and GPU presets
(`models.parse_plain`), composites around inner specs (`composites`) and summation
trees (`tree`), which is why it sits above all three.
"""

from __future__ import annotations

import functools

from convprobe.emulation import composites, tree
from convprobe.emulation.models import AccumulationModel, parse_plain
from convprobe.errors import InvalidArgument

__all__ = ["parse_model"]


def parse_model(spec: str) -> AccumulationModel:
    """Build a model from a spec string.

    Grammar, four forms:

    * ``KIND[:ACCUMULATOR][:KEY=VALUE]...``, KIND one of sequential, pairwise, blocked,
      chunked, exact; ACCUMULATOR a format name (fp16, bf16, tf32, fp32, fp64, fp8_e4m3,
      fp8_e5m2, aliases, or ``p<precision>_emax<emax>``). Keys: product, addition (format
      or exact), output, total (formats), rounding (nearest_even|toward_zero|stochastic,
      or rn|rz|sr), subnormals (keep|flush), overflow (inf|saturate), seed, rbits (random
      bits per stochastic rounding; `convprobe.random_stream`), order
      (permutation of hwc), positions (nhw|hwn: a filter gradient's order over n, oh,
      ow), zeros (signed|positive: the sign of a zero result), n (chunk, any length); blocked also takes b, extra (extra bits, negative to
      narrow), in (input format), adder (format), alignment
      (input_exponents|values), truncate (true|false), step, layout
      (contiguous|pair_interleaved), c_addition (fused|separate).
    * ``GPU[:in=FORMAT][:out=FORMAT][:KEY=VALUE]...``: a tensor-core preset (v100, a100,
      a2, a30, ada, l40s, h100, h200, b200; `convprobe.emulation.gpus`), input fp16 (the
      default), bf16, tf32, fp8_e4m3 or fp8_e5m2, output fp32 (the default) or fp16;
      further keys override the preset's blocked parameters.
    * ``tree(ROOT, accumulator=FORMAT[, product=...][, addition=...][, output=...])``: any
      summation order with a format per node (`convprobe.emulation.tree`).
    * ``splitk(PARTS | length=N, INNER, combine=FORMAT | MODEL[, output=FORMAT])``,
      ``lanes(WIDTH, INNER, combine=MODEL)`` and ``reverse(INNER)``: composites around any inner spec
      (`convprobe.emulation.composites`); identify's ``lanes:FMT:w=W[:then=ORDER]`` is
      shorthand for a lanes model.

    Examples: ``sequential:fp16``, ``sequential:fp16:addition=fp32``, ``blocked:fp16:b=4``,
    ``chunked:fp16:n=1000``, ``exact:fp64``, ``a100``, ``h100:in=fp8_e4m3:out=fp16``,
    ``splitk(4, a100, combine=fp16)``, ``lanes(8, sequential:fp32, combine=pairwise:fp32)``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument(f"model spec must be a non-empty string like 'sequential:fp16'; "
                              f"received {spec!r}")
    return _parsed(spec)


@functools.lru_cache(maxsize=4096)
def _parsed(spec: str) -> AccumulationModel:
    """`parse_model`'s work, once per spec: models are frozen values, and identify parses the
    same composite specs (rows of trees) many times over."""
    head = spec.strip().split(":")[0].strip().lower()
    if head.startswith("tree("):
        return tree.parse_tree_model(spec)
    if "(" in head:
        return composites.parse_composite(spec.strip(), parse_model)
    if head == "lanes":
        return composites.lanes_shorthand(spec, parse_model)
    return parse_plain(spec)
