"""The block-FMA (tensor-core) model: NumPy kernel == exact-rational oracle, and hand-made
cases every preset must get right.

The random half draws models over every parameter (block size, extra bits from -12 to 3,
fp16/fp32 accumulators and adders, rounding, input formats, instruction layout, where c
is added, alignment rule, truncation) and vectors uniformly over each input format's
encodings, so exponent spreads, subnormals and cancellations are common; c is drawn over
fp32's encodings. 10,000 cases in all with the composites (test_composites.py).
"""

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume
from hypothesis import strategies as st

from convprobe import emulation as em
from convprobe.emulation import oracle
from convprobe.emulation.rounding import MODE_CODES
from convprobe.emulation.gpus import INPUTS, OUTPUTS, tensor_core_parameters
from convprobe.emulation.rounding import round_to_format
from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FP16, FP32, FP64, TF32, parse_format
from convprobe.backends import EmulatedBackend
from convprobe.options import Alignment, CAddition, KLayout, Rounding
from convprobe.probes.fingerprint import expected_properties, fingerprint_backend
from convprobe.probes.fingerprint_ops import OPS, QUADRATIC_OPS
from convprobe.testing.strategies import representable_arrays

from .conftest import assert_same_bits, budget, run_cases

def _values(fmt, shape, specials=False):
    """Arrays of `fmt` numbers as float64, uniform over its encodings (tf32 via fp32)."""
    if fmt == TF32:
        return representable_arrays("fp32", shape, allow_nan=specials, allow_infinity=specials).map(
            lambda x: round_to_format(x.astype(np.float64), TF32))
    return representable_arrays(fmt, shape, allow_nan=specials,
                                allow_infinity=specials).map(lambda x: x.astype(np.float64))


@st.composite
def blocked_models(draw):
    acc = draw(st.sampled_from([FP32, FP16, FP32, FP16, BF16, FP64]))
    adder = draw(st.sampled_from([FP32, FP16] if acc == FP64 else [FP32, acc, FP16]))
    b = draw(st.sampled_from([4, 8, 16]) | st.integers(1, 16))  # the presets' sizes, and any
    step = b * draw(st.integers(1, 3))
    layout = draw(st.sampled_from(list(KLayout))) if step % 4 == 0 else KLayout.CONTIGUOUS
    return em.Blocked(
        acc, b=b, extra_bits=draw(st.integers(max(-12, 2 - adder.precision), 3)), adder=adder,
        input=draw(st.sampled_from([parse_format(f) for f in INPUTS])),
        rounding=draw(st.sampled_from(["toward_zero", "nearest_even"])),
        output=draw(st.sampled_from([acc, FP16, FP32])),
        alignment=draw(st.sampled_from(list(Alignment))),
        truncate=draw(st.booleans()) if draw(st.integers(0, 9)) == 0 else True,
        step=step, layout=layout, c_addition=draw(st.sampled_from(list(CAddition))),
        subnormals=draw(st.sampled_from(["keep", "flush"])),
        overflow=draw(st.sampled_from(["inf", "saturate"])),
        product=draw(st.sampled_from(["exact", "exact", "exact", "fp32"])),
    )


@st.composite
def cases(draw, model):
    k = draw(st.integers(1, 40))
    rows = draw(st.integers(1, 3))
    specials = draw(st.integers(0, 9)) == 0
    a = draw(_values(model.input, (rows, k), specials))
    b = draw(_values(model.input, (rows, k), specials))
    c = draw(st.one_of(st.just(np.zeros(rows)), _values(parse_format("fp32"), (rows,), specials)))
    return a, b, c


@budget(500, 6000)
def test_block_fma_matches_the_oracle_over_every_parameter(cases_budget):
    def body(data):
        model = data.draw(blocked_models())
        a, b, c = data.draw(cases(model))
        with np.errstate(all="ignore"):
            assert_same_bits(em.dot(a, b, model, c=c), oracle.dot(a, b, model, c=c))

    run_cases(cases_budget, body)


def _presets():
    out = []
    for gpu in ("v100", "a100", "ada", "h100", "b200"):
        for fin in INPUTS:
            for fout in OUTPUTS:
                try:
                    tensor_core_parameters(gpu, fin, fout)
                except InvalidArgument:
                    continue
                out.append(f"{gpu}:in={fin}:out={fout}")
    return out


PRESETS = _presets()


def test_every_family_has_its_published_formats():
    assert len(PRESETS) == 30  # the 30 sets of the validation data: one preset each
    assert "v100:in=fp16:out=fp16" in PRESETS and "b200:in=fp8_e5m2:out=fp32" in PRESETS


@budget(300, 2000)
def test_every_preset_matches_the_oracle_on_wide_ranging_vectors(cases_budget):
    def body(data):
        model = em.parse_model(data.draw(st.sampled_from(PRESETS)))
        a, b, c = data.draw(cases(model))
        with np.errstate(all="ignore"):
            assert_same_bits(em.dot(a, b, model, c=c), oracle.dot(a, b, model, c=c))

    run_cases(cases_budget, body)


# -- hand-made cases: what the data's random vectors do not reach ----------------------

def _dot(spec, a, b, c=0.0):
    model = em.parse_model(spec)
    a, b = np.array([a], np.float64), np.array([b], np.float64)
    c = np.array([c], np.float64)
    with np.errstate(all="ignore"):
        got = em.dot(a, b, model, c=c)
        want = oracle.dot(a, b, model, c=c)
    assert_same_bits(got, want)
    return float(got[0])


def _pad(values, k):
    return list(values) + [0.0] * (k - len(values))


def test_the_issue_s_single_block_examples():
    """Alignment to e_a + e_b: 384 * 384 has exponent 16 + 1 carry bits above e_a + e_b = 16."""
    assert _dot("v100", [384, -384, 2**-3, 0], [384, 384, 2**-4, 0]) == 2**-7
    assert _dot("a100", _pad([256, -256, 2**-5], 8), _pad([256, 256, 2**-5], 8)) == 0.0


@pytest.mark.parametrize("spec", PRESETS)
def test_exact_cancellation_leaves_the_small_term(spec):
    model = em.parse_model(spec)
    k = model.step
    big = 2.0**4
    got = _dot(spec, _pad([big, -big, 1.0], k), _pad([1.0, 1.0, 2.0**-3], k))
    assert got == 2.0**-3


@pytest.mark.parametrize("spec", PRESETS)
def test_alignment_shift_wider_than_the_accumulator_drops_the_small_term(spec):
    """2**top * 2**top and 2**emin * 2**emin lie 2 (top - emin) >= 26 bits apart, beyond every
    preset's alignment (at most 23 + 2 fraction bits): the small product is truncated away,
    and the result is the large product alone, even where nearest rounding of the exact
    sum would also drop it."""
    model = em.parse_model(spec)
    top, low = min(model.input.emax - 1, 7), model.input.emin
    assert 2 * (top - low) > 23 + model.extra_bits  # below the quantum 2**(E - 23 - extra)
    k = model.step
    got = _dot(spec, _pad([2.0**top, 2.0**low], k), _pad([2.0**top, 2.0**low], k))
    assert got == 2.0 ** (2 * top)
    # the same small product alone is kept exactly: it was the alignment that dropped it
    assert _dot(spec, _pad([2.0**low], k), _pad([2.0**low], k)) == float(
        round_to_format(np.array([2.0 ** (2 * low)]), model.output)[0])


@pytest.mark.parametrize("spec", PRESETS)
def test_subnormal_inputs_and_results_are_kept(spec):
    model = em.parse_model(spec)
    fin = model.input
    k = model.step
    sub = fin.smallest_subnormal
    got = _dot(spec, _pad([sub], k), _pad([1.0], k))
    assert got == float(round_to_format(np.array([sub]), model.output)[0]) and got != 0.0
    if model.output == FP32:  # a product below fp32's normal range: a subnormal fp32 result
        tiny = 2.0**-130
        if fin.emin <= -65:  # bf16 and tf32 inputs reach it
            assert _dot(spec, _pad([2.0**-65], k), _pad([2.0**-65], k)) == tiny


@pytest.mark.parametrize("spec", [s for s in PRESETS if s.endswith("out=fp32")])
def test_a_carry_at_the_top_of_fp32_overflows_to_inf(spec):
    """c = fp32 max plus a product that carries it past 2**128: inf, although every term is
    finite and the sum is truncated (tensor cores overflow to inf in every rounding)."""
    model = em.parse_model(spec)
    k = model.step
    top = float(np.finfo(np.float32).max)
    big = 2.0 ** min(model.input.emax, 60)
    got = _dot(spec, _pad([big], k), _pad([big], k), c=top)
    # fp8 inputs cannot reach 2**104 (one ulp of fp32 max): the sum stays finite
    kept = float(round_to_format(np.array([top]), model.block_format, "toward_zero")[0])
    assert got == (math.inf if big * big >= 2.0**104 else kept)
    # a narrowed (e8m13) accumulator truncates c itself to 14 bits
    assert _dot(spec, _pad([1.0], k), _pad([1.0], k), c=top) == kept


@pytest.mark.parametrize("spec", PRESETS)
def test_inf_and_nan_propagate(spec):
    model = em.parse_model(spec)
    k = model.step
    if model.input.has_inf:
        inf = math.inf
        assert _dot(spec, _pad([inf, 1.0], k), _pad([1.0, 1.0], k)) == inf
        assert math.isnan(_dot(spec, _pad([inf, inf], k), _pad([1.0, -1.0], k)))
        assert math.isnan(_dot(spec, _pad([inf], k), _pad([0.0], k)))
    assert math.isnan(_dot(spec, _pad([math.nan], k), _pad([1.0], k)))
    assert _dot(spec, _pad([1.0], k), _pad([1.0], k), c=-math.inf) == -math.inf


def test_c_is_rounded_to_an_fp16_accumulator_first():
    """fp16 output: c = 1 + 2**-12 becomes 1 before it meets the products."""
    assert _dot("v100:out=fp16", [2.0**-11, 0, 0, 0], [1.0, 0, 0, 0], c=1.0 + 2.0**-12) == 1.0
    assert _dot("v100", [2.0**-11, 0, 0, 0], [1.0, 0, 0, 0], c=1.0 + 2.0**-12) == 1.0 + 2.0**-11 + 2.0**-12


def test_b200_fp8_adds_c_after_the_products_to_nearest():
    """The products sum (truncated) to 1 + 2**-23 + 2**-24 ... then c is added in one
    nearest-even rounding: a fused truncating block would lose what nearest keeps."""
    k = 32
    a = _pad([1.0], k)
    b = _pad([1.0], k)
    c = 2.0**-24 * 3  # 1 + 3 * 2**-24: nearest gives 1 + 2**-22, truncation 1 + 2**-23
    assert _dot("b200:in=fp8_e4m3", a, b, c=c) == 1.0 + 2.0**-22
    assert _dot("h100:in=fp8_e4m3:out=fp32", a, b, c=0.0) == 1.0


def test_c_needs_a_block_fma_model():
    with pytest.raises(InvalidArgument, match="c \\(an accumulator input, D = A.B \\+ C\\) needs a block-FMA"):
        em.dot(np.ones(4, np.float16), np.ones(4, np.float16), em.parse_model("sequential:fp16"),
               c=np.zeros(()))


@pytest.mark.parametrize("spec", ["a100:in=bf16", "splitk(2, a100:in=bf16, combine=fp32)"])
def test_convolutions_refuse_inputs_outside_the_input_format(spec):
    """Checked once per operand, on x and w themselves (before im2col), inner models too."""
    x = np.full((1, 4, 4, 2), 1.0 + 2.0**-10, np.float16)  # an fp16 value that bf16 lacks
    w = np.ones((3, 3, 2, 2), np.float16)
    with pytest.raises(InvalidArgument, match="x holds values that are not bf16 numbers"):
        em.conv2d(x, w, em.parse_model(spec), padding="SAME")
    with pytest.raises(InvalidArgument, match="w holds values that are not fp16 numbers"):
        em.conv2d(np.ones((1, 4, 4, 2), np.float16), np.full((3, 3, 2, 2), 1.0 + 2.0**-20, np.float32),
                  em.parse_model("a100"))


@pytest.mark.parametrize("shape", [(8,), (4, 8)])  # a matrix product; rows, each with its own b
def test_inputs_outside_the_input_format_are_refused(shape):
    for dtype in (np.float32, np.float64):
        with pytest.raises(InvalidArgument, match="not fp16 numbers, the input format of a100"):
            em.dot(np.full(shape, 1.0 + 2.0**-20, dtype), np.ones(shape, dtype), em.parse_model("a100"))


@budget(200, 2000)
def test_the_compiled_gemm_equals_the_numpy_gemm(cases_budget):
    """Convolutions go through `_block_fma_compiled` where it applies: bit for bit the NumPy
    path (itself checked against the oracle above), on (M, K) x (K, N) problems, with M
    on both sides of the kernel's row tile; its fused four-term, normal-range and general
    rounding paths are all drawn."""
    from convprobe.emulation import _block_fma, _block_fma_compiled

    def body(data):
        model = data.draw(blocked_models())
        if not _block_fma_compiled.applies(model):
            model = dataclasses.replace(model, product="exact", alignment=Alignment.INPUT_EXPONENTS,
                                        truncate=True)
        assume(_block_fma_compiled.applies(model))  # its range check leaves fp64 accumulators out
        tile = _block_fma_compiled.TILE
        m = data.draw(st.integers(1, 4) | st.sampled_from([tile - 1, tile, tile + 1, 2 * tile + 3]))
        k, n = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 5))
        specials = data.draw(st.integers(0, 9)) == 0
        a = data.draw(_values(model.input, (m, k), specials))
        w = data.draw(_values(model.input, (k, n), specials))
        with np.errstate(all="ignore"):
            assert_same_bits(_block_fma.gemm(a, w, model), _block_fma.gemm(a, w, model, compiled=False))

    run_cases(cases_budget, body)


def test_the_compiled_gemm_reproduces_the_real_gpu_vectors():
    """The compiled kernel covers every preset of the bundled data, and reproduces every
    tenth real MMA vector of each of the 30 sets bit for bit (c as the accumulator input,
    where the capture used one;
    the NumPy path replays all of them in tests/probes/test_replay.py)."""
    from convprobe.emulation import _block_fma, _block_fma_compiled
    from convprobe.probes import replay

    for s in replay.load_bundled():
        model = em.parse_model(f"{s.preset}:in={s.input}:out={s.output}")
        assert _block_fma_compiled.applies(model), model.to_spec()
        order = _block_fma.step_order(s.a.shape[1], model)
        a = s.a.view(np.float32).astype(np.float64)[:, order]
        b = s.b.view(np.float32).astype(np.float64)[:, order]
        c = np.zeros(s.vectors) if replay.c_is_zero(s) else _block_fma._round(
            s.c.view(np.float32).astype(np.float64), model.accumulator, model, Rounding.NEAREST_EVEN)
        rows = range(0, s.vectors, 10)
        got = [_block_fma._round(_block_fma_compiled.gemm(a[i:i + 1], b[i:i + 1].T, model, c=c[i]),
                                 model.output, model, Rounding.NEAREST_EVEN)[0, 0] for i in rows]
        bits = np.asarray(got, dtype=np.float32).view(np.uint32)  # fp16 results widen exactly
        assert (bits == s.d[list(rows)]).all(), f"{s.gpu} {s.input}->{s.output}: " \
            f"{int((bits != s.d[list(rows)]).sum())} of {len(rows)} vectors differ"


@pytest.mark.parametrize("spec", ["v100", "a100", "h100", "b200", "b200:in=fp8_e4m3", "ada:in=fp8_e4m3",
                                  "h100:in=fp8_e5m2:out=fp16", "v100:out=fp16", "a100:out=fp16", "blocked:fp16:b=4",
                                  "blocked:fp16:b=8:rounding=nearest_even", "blocked:fp16:b=4:subnormals=flush",
                                  "blocked:fp16:b=4:step=8:c_addition=separate", "a100:in=bf16"])
def test_the_32_bit_lanes_equal_the_float64_kernel_and_the_numpy_gemm(spec):
    """fp16/fp8 inputs go to `_block_fma_narrow` (32-bit lanes; fused int32 blocks into fp32
    and fp16), bf16 inputs must not (float32 cannot hold their products). Bit for bit the
    float64 kernel and the NumPy path, K = 301 (a ragged last block), with zeros, subnormal
    inputs, and in the rows the 32-bit kernel computes itself (the first tile) fp16 block
    sums that overflow and that are subnormal; a separate addition of c; an inf and a NaN
    in two other tiles, whose rows the float64 kernel takes."""
    from convprobe.emulation import _block_fma, _block_fma_compiled, _block_fma_narrow

    model = em.parse_model(spec)
    assert (_block_fma_compiled.applies(model) and _block_fma_narrow.applies(model)) == (model.input.name != "bf16")
    rng = np.random.default_rng(11)
    fmt, tile = model.input, _block_fma_narrow.TILE
    rows = 3 * tile + 8  # (a last, partial tile)
    scale = rng.choice([2.0**-12, 1.0, 2.0**6], size=(rows, 301))
    scale[10:20] = min(2.0**11, fmt.max / 8)  # fp16 inputs: sums past fp16's range
    scale[30:50] = 2.0**-20  # fp16 sums near 2**-14
    a = round_to_format(rng.standard_normal((rows, 301)) * scale, fmt)
    w = round_to_format(rng.standard_normal((301, 20)) * 4, fmt)  # (a block of 16 channels, and part of one)
    a[:, 5] = 0.0
    a[7] = 0.0
    a[tile + 6, 3], a[2 * tile + 12, 9] = np.inf, np.nan
    with np.errstate(all="ignore"):
        fast = _block_fma_compiled.gemm(a, w, model)
        assert_same_bits(fast, _block_fma_compiled.gemm(a, w, model, narrow=False))
        assert_same_bits(_block_fma.gemm(a, w, model), _block_fma.gemm(a, w, model, compiled=False))
        if _block_fma_narrow.applies(model):
            own, redone = _block_fma_narrow.gemm(a, w, model, False, _block_fma_compiled._limits(
                model.block_format, model.subnormals == "keep"), _block_fma_compiled._limits(
                model.accumulator, model.subnormals == "keep"), MODE_CODES[model.rounding])
            assert redone.tolist() == list(range(tile, 3 * tile))  # the two tiles with an inf or a NaN
    first = fast[:tile]
    if model.accumulator.max < 1e5:  # the fp16 accumulators overflow in the first tile, and reach subnormals
        assert np.isinf(first).any() and np.isfinite(first).any()
        if model.subnormals == "keep" and model.input.name == "fp16":
            assert ((first != 0) & (np.abs(first) < 2.0**-14)).any()


@pytest.mark.parametrize("op", [op for op in OPS if op not in QUADRATIC_OPS])
def test_every_op_embedding_feeds_the_block_fma_model_in_index_order(op):
    """The fingerprint reads blocked:fp16:b=4's own parameters through every op's embedding
    on the emulator (as tests/probes/test_fingerprint.py does for the scalar models; here
    because this file's process compiles the kernel the conv ops take, once for both)."""
    model = em.parse_model("blocked:fp16:b=4")
    assert fingerprint_backend(EmulatedBackend(model), op) == expected_properties(model)


@pytest.mark.parametrize("spec", ["v100", "a100", "h100:in=fp8_e5m2:out=fp16", "v100:out=fp16",
                                  "blocked:fp16:b=4:step=8:c_addition=separate",
                                  "blocked:fp16:b=8:step=16:layout=pair_interleaved:rounding=nearest_even"])
def test_dot_rows_run_the_32_bit_lanes_bit_for_bit(spec, monkeypatch):
    """`dot` on rows that each have their own b takes the 32-bit kernel (products of the
    two operands, exponents e_a + e_b): the same bits as the NumPy `reduce_rows`, with every
    fp16 code point (fp8's, for fp8 inputs) as a first operand beside signed terms of spread
    exponents, ties and zeros, an inf and a NaN in two tiles (those rows by `reduce_rows`),
    and an input order the layout permutes."""
    from convprobe.emulation import _block_fma, _block_fma_compiled, _block_fma_narrow

    model = em.parse_model(spec)
    rng = np.random.default_rng(17)
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    codes = np.unique(round_to_format(codes[np.isfinite(codes)], model.input))
    codes = codes[np.isfinite(codes)]  # (fp8's largest codes round fp16's to inf)
    k, tile = 37, _block_fma_narrow.TILE
    rows = max(codes.size, 3 * tile + 5)  # (fp8's few codes repeat: three tiles and a partial one)
    scale = rng.choice([2.0**-12, 1.0, 2.0**6], size=(rows, k))
    a = round_to_format(rng.standard_normal((rows, k)) * scale, model.input)
    b = round_to_format(rng.standard_normal((rows, k)) * 4, model.input)
    a[:, 0], b[:, 0] = np.resize(codes, rows), round_to_format(np.full(rows, 1.5), model.input)
    a[:, 3] = -a[:, 2]  # (exact cancellations)
    b[10:20, 5] = 0.0
    if model.input.has_inf:
        a[tile + 1, 4] = np.inf
    b[2 * tile + 3, 7] = np.nan
    reference, by_numpy = _block_fma.reduce_rows, []

    def recorded(a, b, c, model):  # (the rows dot_rows leaves to NumPy)
        by_numpy.append(len(a))
        return reference(a, b, c, model)

    with np.errstate(all="ignore"):
        monkeypatch.setattr(_block_fma, "reduce_rows", recorded)
        got = _block_fma.dot_rows(a, b, model)
        monkeypatch.undo()
        assert by_numpy == [tile * (2 if model.input.has_inf else 1)]  # those two tiles' rows, no more
        want = _block_fma.reduce_rows(a, b, None, model)
        assert_same_bits(got, np.asarray(want, np.float64))
        assert_same_bits(em.dot(a, b, model).astype(np.float64), np.asarray(want, np.float64))
        # float32 carriers (what `dot` passes for fp16 or fp8 dtypes), the NumPy rows in float64
        assert_same_bits(_block_fma.dot_rows(a.astype(np.float32), b.astype(np.float32), model), got)
        dtype = np.dtype(getattr(ml_dtypes, model.input.dtype_name, model.input.dtype_name))
        a_n, b_n = (x.astype(dtype) for x in (a, b))
        carried = []
        monkeypatch.setattr(type(model), "dot_rows", lambda self, a, b, c: carried.append(a.dtype) or
                            _block_fma.dot_rows(a, b, self))
        assert_same_bits(em.dot(a_n, b_n, model).astype(np.float64), np.asarray(want, np.float64))
        assert carried == [np.float32]  # (no float64 copy of the operands)
    assert np.isnan(got[2 * tile + 3])
    _, redone = _block_fma_compiled.rows(a, b, model)  # the kernel took every tile but those two
    assert sorted(set(redone // tile)) == ([1, 2] if model.input.has_inf else [2])
