"""Whether an op is a direct sum of products, the premise of every model identify fits.

A direct convolution (im2col + GEMM, implicit GEMM, a loop nest), whatever it does
with K (splits, lanes, chunks, accumulators, rounded products), computes each output
from the products of its own window and nothing else. Three consequences can be tested
bit for bit, at the layer's shape, through any backend:

* **products only**: scale each input of one output's window by a power of two and
  its partner in the other operand by the inverse. Every product of that output keeps
  its value, so the output keeps every bit.
* **window only**: replace every value of the first operand (x, or dy for the input
  gradient) that the output does not read by large values. The output keeps every bit.
* **ties**: give the output one product, exactly halfway between two fp16 values, and
  again replace the values outside its window (`TIE_FILLS` times). A direct sum rounds
  the same tie the same way however it accumulates.

Every call runs twice: a kernel that gives other bits on the same inputs (atomic
split-K on a GPU) is said to be nondeterministic, and no test is judged.
`probe` runs all three at a layer; `probe_rows` runs the first on the battery's rows
(`fingerprint_ops`), where each output reads all of its row, so the others have
nothing to change.

Winograd and FFT convolutions are not sums of the x * w products. They transform tiles
of the input (or all of it) and the filter, multiply the transforms, and transform
back, rounding along the way (Lavin and Gray, "Fast Algorithms for Convolutional
Neural Networks", CVPR 2016). Rescaled factors change what the transforms round (fp16
transforms overflow outright), and with factors of 2**13 and 2**-13 that rounding shows
in fp16 outputs even where the transforms run in fp32 (TensorFlow asks cuDNN for fp32
compute on fp16 convolutions unless TF_FP16_CONV_USE_FP32_COMPUTE=0): the first test
fails. In F(m x m, 3 x 3) with m >= 3 each output's transformed terms reach past its
window into its tile, and an FFT's over the whole image, so large outside values leak
into the output through rounding: the second test fails too. F(2 x 2, 3 x 3) is local
(each output's transformed terms come from its own window), so only the first test
sees it. A transform in fp64 rounds far below fp16's resolution, and its outputs are
those of the exact sum rounded to fp16, except at a tie: there any error, however
small, decides which way the output rounds, and its sign follows the whole image's
values: each fill of outside values changes about half the tied outputs (the third
test; docs/direct-sum-transforms.md). What none of the tests sees is a local transform
that is exact on one product (an fp64 F(2 x 2, 3 x 3)): its outputs are then those of
the exact sum, rounded once, except near ties.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from convprobe.probes.fingerprint_ops import BATTERY_OP_SEEDS, reduce_many
from convprobe.probes.layers import OP_SEEDS, Layer, op_shapes, run_ops
from convprobe.identify.structure import bitwise_equal

__all__ = ["DirectSum", "not_direct", "probe", "probe_rows", "safely", "TRIALS"]

#: Outputs tested per op, at most (forward, input gradient: positions; filter gradient: taps).
TRIALS = 3
_FP16 = np.finfo(np.float16)
#: The operands' magnitudes are [0.5, 1). Rescaling a factor pair by 2**e and 2**-e stays
#: exact while 0.5 * 2**-e is a normal fp16: e up to 13. The largest e is used because a
#: transform's rounding grows with it: its transformed tiles mix factors of 2**e and
#: 2**-e, whose cross terms only cancel in exact arithmetic. Small e (2) left an fp32
#: Winograd unseen, its errors below what fp16 outputs show.
EXPONENT = int(-np.log2(float(_FP16.smallest_normal))) - 1
#: The inputs placed outside a window are [0.5, 1) * 2**16, fp16's largest binade (up to
#: 65504): an FFT's rounding of the whole image grows with them.
OUTSIDE = float(2 ** _FP16.maxexp)
#: The ties test's product is a * b with a = odd * 2**-12 (odd < 2**5) and b = odd * 2**-13
#: (odd < 2**6): both normal fp16 (at least 2**-13 > 2**-14), their product odd * 2**-25
#: below 2**-14, halfway between two fp16 subnormals (spaced 2**-24) and exact in fp32.
#: At that scale an fp64 transform's error (relative to the image's largest values) is
#: still larger than an fp32 rounding of the output, so it reaches the fp16 bits.
TIE_FACTORS = ((5, 12), (6, 13))
#: Fills of outside values each tie is compared under. A transform's error at a tie has a
#: sign that follows the fill, so one fill leaves a tied output unchanged about half the
#: time (a 1-channel layer's 3 outputs all unchanged at 2 of 6 seeds); three, an eighth.
TIE_FILLS = 3


@dataclass(frozen=True)
class DirectSum:
    """The evidence: `direct` is True when no tested output changed, False when one did,
    None when nothing could be tested (`note` says why)."""

    direct: bool | None
    outputs: int = 0
    changed_by_rescaling: int = 0
    #: Outputs the window-only test reached (none where an output reads every input).
    outside_outputs: int = 0
    changed_by_outside: int = 0
    #: Outputs the ties test reached (as the window-only test) and those it changed.
    tie_outputs: int = 0
    changed_at_ties: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DirectSum:
        return cls(**data)

    @property
    def reason(self) -> str:
        """One clause for an explanation."""
        if self.direct is not False:
            return self.note or (f"a direct sum of products ({self.outputs} outputs unchanged by rescaled factors, "
                                 f"{self.outside_outputs} by other inputs outside their windows, {self.tie_outputs} "
                                 f"at fp16 ties)")
        outside = (f", {self.changed_by_outside} of {self.outside_outputs} when only inputs outside their windows "
                   f"changed" if self.outside_outputs else "")
        ties = (f", {self.changed_at_ties} of {self.tie_outputs} at fp16 ties when only those inputs changed"
                if self.tie_outputs else "")
        return (f"not a direct sum of products: of {self.outputs} outputs, {self.changed_by_rescaling} changed when "
                f"their products were kept and their factors rescaled{outside}{ties} (a Winograd- or FFT-style "
                f"transform)")


_NONDETERMINISTIC = DirectSum(None, note="the op gave other bits on the same inputs (nondeterministic): not tested")


def _triples(size, k, out, s, d, top):
    """Every (tap, output position, input position) of one dimension with the input in bounds."""
    return [(t, o, o * s - top + t * d) for o in range(out) for t in range(k) if 0 <= o * s - top + t * d < size]


def _choices(op: str, layer: Layer) -> list[tuple[int, int]]:
    """The tested outputs: up to `TRIALS` (h, w) output positions (forward), input
    positions (input gradient) or taps (filter gradient), spread over their range."""
    spans = [{"conv2d": out, "conv2d_backprop_input": size, "conv2d_backprop_filter": k}[op]
             for size, k, out, *_ in layer.dimensions]
    picks = [np.linspace(0, span - 1, TRIALS).round().astype(int).tolist() for span in spans]
    return list(dict.fromkeys(zip(*picks)))


def _pairs(op: str, layer: Layer, chosen: tuple[int, int]) -> list[list[tuple[int, int]]] | None:
    """Per dimension, the (first operand position, second operand position) pairs of the
    chosen output's products; None where it has none in bounds."""
    pairs = []
    for dim, at in zip(layer.dimensions, chosen):
        triples = _triples(*dim)
        if op == "conv2d":  # x at the input position, w at the tap
            found = [(q, t) for t, o, q in triples if o == at]
        elif op == "conv2d_backprop_input":  # dy at the output position, w at the tap
            found = [(o, t) for t, o, q in triples if q == at]
        else:  # x at the input position, dy at the output position
            found = [(q, o) for t, o, q in triples if t == at]
        if not found:
            return None
        pairs.append(found)
    return pairs


def _binade(rng, shape) -> np.ndarray:
    """Random fp16 values of magnitude [0.5, 1), every code point equally likely, random
    signs: drawn as code points, so no value rounds up to 1 on its way to fp16."""
    magnitude = (1024 + rng.integers(0, 1024, shape)) / 2048
    return magnitude * rng.choice([-1.0, 1.0], shape)


def _operands(layer: Layer, op: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded operands of magnitude [0.5, 1): every power-of-two rescaling by up to
    2**EXPONENT stays exact in fp16."""
    rng = np.random.default_rng([seed, 7, OP_SEEDS[op]])
    first, second = (_binade(rng, shape).astype(np.float16) for shape in op_shapes(layer, op))
    return first, second


def _rescaled(op, first, second, pairs, rng):
    """Copies with each product of the output kept and its two factors scaled by 2**e, 2**-e."""
    first, second = first.copy(), second.copy()
    for (a_h, b_h) in pairs[0]:
        for (a_w, b_w) in pairs[1]:
            if op == "conv2d_backprop_filter":  # per image: x[n, q, :] and dy[n, o, :]
                scale = np.exp2(rng.choice([-EXPONENT, EXPONENT], (first.shape[0], 1)))
                first[:, a_h, a_w, :] *= scale.astype(np.float16)
                second[:, b_h, b_w, :] *= (1 / scale).astype(np.float16)
                continue
            # per channel of the first operand: x[0, q, c] with w[t, c, :], dy[0, o, c] with w[t, :, c]
            scale = np.exp2(rng.choice([-EXPONENT, EXPONENT], first.shape[3]))
            first[0, a_h, a_w, :] *= scale.astype(np.float16)
            inverse = (1 / scale).astype(np.float16)
            second[b_h, b_w] *= inverse[:, None] if op == "conv2d" else inverse[None, :]
    return first, second


def _outside(op, first, pairs, rng):
    """A copy of the first operand with every value its output does not read replaced by
    +-OUTSIDE-scale values (the forward and input gradient outputs sit in image 0)."""
    inside = np.zeros(first.shape[:3], bool)
    rows, cols = np.ix_([a for a, _ in pairs[0]], [a for a, _ in pairs[1]])
    inside[slice(None) if op == "conv2d_backprop_filter" else 0, rows, cols] = True
    if inside.all():
        return None
    return np.where(inside[..., None], first, (_binade(rng, first.shape) * OUTSIDE).astype(np.float16))


def _tie_factors(rng, count: int, bits: int, exponent: int) -> np.ndarray:
    """`count` values +-odd * 2**-exponent, odd < 2**bits (`TIE_FACTORS`)."""
    odd = 2 * rng.integers(0, 2 ** (bits - 1), count) + 1
    return odd * 2.0 ** -exponent * rng.choice([-1.0, 1.0], count)


def _tied(op, first, second, pairs, rng):
    """Copies where each tested output (every channel at the chosen position or tap) has one
    product, a tie: the first operand's window is zero but for one value (one per channel
    for the filter gradient) and its partners in the second operand are `TIE_FACTORS`."""
    (a_h, b_h), (a_w, b_w) = (axis[rng.integers(len(axis))] for axis in pairs)
    rows, cols = np.ix_([a for a, _ in pairs[0]], [a for a, _ in pairs[1]])
    (a_bits, a_exponent), (b_bits, b_exponent) = TIE_FACTORS
    first, second = first.copy(), second.copy()
    if op == "conv2d_backprop_filter":  # dw[t, c, o] = x[n, q, c] * dy[n, o', o]
        image = rng.integers(first.shape[0])
        first[:, rows, cols] = 0
        first[image, a_h, a_w] = _tie_factors(rng, first.shape[3], a_bits, a_exponent)
        second[image, b_h, b_w] = _tie_factors(rng, second.shape[3], b_bits, b_exponent)
        return first, second
    channel = rng.integers(first.shape[3])  # y[o] = x[q, c] * w[t, c, o]; dx[c'] = dy[o, c] * w[t, c', c]
    first[0, rows, cols] = 0
    first[0, a_h, a_w, channel] = _tie_factors(rng, 1, a_bits, a_exponent)[0]
    partners = second.shape[3] if op == "conv2d" else second.shape[2]
    factors = _tie_factors(rng, partners, b_bits, b_exponent)
    if op == "conv2d":
        second[b_h, b_w, channel] = factors
    else:
        second[b_h, b_w, :, channel] = factors
    return first, second


def _read(op: str, y: np.ndarray, chosen: tuple[int, int]) -> np.ndarray:
    """The tested outputs' bits: all channels at the chosen position (image 0) or tap."""
    h, w = chosen
    return _bits(y[h, w] if op == "conv2d_backprop_filter" else y[0, h, w])


def _bits(y: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(y, np.float16).view(np.uint16).reshape(-1)


def probe(backend, layer: Layer, op: str, seed: int = 0) -> DirectSum:
    """The three tests (module docstring) at up to `TRIALS` outputs of `op` at `layer`: the
    calls run together (one XLA compilation)."""
    first, second = _operands(layer, op, seed)
    rng = np.random.default_rng([seed, 11, OP_SEEDS[op]])
    ties_rng = np.random.default_rng([seed, 17, OP_SEEDS[op]])
    calls, tests = [(first, second)], []
    for chosen in _choices(op, layer):
        pairs = _pairs(op, layer, chosen)
        if pairs is None:
            continue
        calls.append(_rescaled(op, first, second, pairs, rng))
        outside = _outside(op, first, pairs, rng)
        if outside is not None:
            tied_first, tied_second = _tied(op, first, second, pairs, ties_rng)
            calls += [(outside, second), (tied_first, tied_second)]
            calls += [(_outside(op, tied_first, pairs, ties_rng), tied_second) for _ in range(TIE_FILLS)]
        tests.append((chosen, outside is not None))
    if not tests:
        return DirectSum(None, note="no output of this layer has in-bounds products: not tested")
    with np.errstate(over="ignore", invalid="ignore"):
        outputs = _repeatable(run_ops(backend, layer, op, calls + calls))
    if outputs is None:
        return _NONDETERMINISTIC
    base, rest = outputs[0], iter(outputs[1:])
    counted, by_rescaling, reached, by_outside, at_ties = 0, 0, 0, 0, 0

    def changed(expected, chosen):
        return ~bitwise_equal(_read(op, next(rest), chosen), expected)

    for chosen, has_outside in tests:
        expected = _read(op, base, chosen)
        counted += expected.size
        by_rescaling += int(np.count_nonzero(changed(expected, chosen)))
        if has_outside:
            reached += expected.size
            by_outside += int(np.count_nonzero(changed(expected, chosen)))
            tied = _read(op, next(rest), chosen)
            at_ties += int(np.count_nonzero(np.any([changed(tied, chosen) for _ in range(TIE_FILLS)], axis=0)))
    return DirectSum(by_rescaling == 0 and by_outside == 0 and at_ties == 0, counted, by_rescaling, reached,
                     by_outside, tie_outputs=reached, changed_at_ties=at_ties)


def not_direct(record: dict) -> bool:
    """Whether an op's record (a child result or a summary) holds the evidence that it is
    not a direct sum; False where the probe did not run (older documents) or was undecided."""
    return (record.get("direct") or {}).get("direct") is False


def probe_rows(backend, op: str, k: int, channel: np.ndarray, seed: int = 0) -> DirectSum:
    """The products-only test on the battery's embedding of `op` (`fingerprint_ops.op_call`):
    len(channel) rows of K terms, row m reading filter channel[m]. Column j of the rows and
    of every filter is rescaled by 2**e_j and 2**-e_j, so every row keeps its products."""
    rng = np.random.default_rng([seed, 13, BATTERY_OP_SEEDS[op], k])
    a = _binade(rng, (len(channel), k))
    b = _binade(rng, (int(np.max(channel)) + 1, k))
    scale = np.exp2(rng.choice([-EXPONENT, EXPONENT], k))
    requests = [(a.astype(np.float16), b.astype(np.float16), channel),
                ((a * scale).astype(np.float16), (b / scale).astype(np.float16), channel)]
    outputs = _repeatable([np.asarray(y, np.float16) for y in reduce_many(backend, op, requests + requests)])
    if outputs is None:
        return _NONDETERMINISTIC
    base, rescaled = (_bits(y) for y in outputs)
    changed = int(np.count_nonzero(~bitwise_equal(rescaled, base)))
    return DirectSum(changed == 0, base.size, changed)


def _repeatable(outputs: list) -> list | None:
    """The first half of outputs from calls made twice over, or None where a call gave other
    bits the second time: a changed output must not be a nondeterministic kernel's noise."""
    half = len(outputs) // 2
    if all(bitwise_equal(_bits(y), _bits(again)).all() for y, again in zip(outputs[:half], outputs[half:])):
        return outputs[:half]
    return None


def safely(test, *args) -> DirectSum:
    """`test(*args)` (`probe` or `probe_rows`), where a failure of the test itself is its note,
    not the op's failure (the op already ran): identify still measures and confirms it."""
    try:
        return test(*args)
    except Exception as exc:  # noqa: BLE001 - the op's own record must survive the probe
        return DirectSum(None, note=f"not tested: {type(exc).__name__}: {exc}")
