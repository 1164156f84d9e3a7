"""The plugin's assertions: exact pass/fail boundaries and messages that explain the numbers."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from convprobe.emulation import dot, parse_model
from convprobe.errors import InvalidArgument
from convprobe.formats import parse_format
from convprobe.testing import (
    assert_all_finite,
    assert_no_gradient_underflow,
    assert_ulp_close,
    assert_within_error_bound,
)

# --------------------------------------------------------------------------- assert_ulp_close

#: For each format, a base 2**(p-1) where one ulp is exactly 1.0: the values base + k
#: (k < base) are representable and k ulp away from base.
ULP_ONE_BASES = {name: math.ldexp(1.0, parse_format(name).precision - 1) for name in
                 ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp32")}


@pytest.mark.parametrize("fmt", sorted(ULP_ONE_BASES))
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_ulp_close_passes_at_k_and_fails_at_k_plus_one(fmt, k):
    f = parse_format(fmt)
    base = ULP_ONE_BASES[fmt]
    expected = np.array([base, -base], dtype=np.float64).astype(f.dtype)
    at_k = np.array([base + k, -(base + k)], dtype=np.float64).astype(f.dtype)
    beyond = np.array([base + k + 1, -(base + k + 1)], dtype=np.float64).astype(f.dtype)
    assert at_k.astype(np.float64).tolist() == [base + k, -(base + k)]  # one ulp is 1.0 here
    assert_ulp_close(at_k, expected, k, fmt)
    with pytest.raises(AssertionError, match=rf"not within {k} ulp of expected in {fmt}: 2 of 2 elements are farther, the worst {k + 1} ulp"):
        assert_ulp_close(beyond, expected, k, fmt)


def test_ulp_close_counts_steps_across_zero_and_through_subnormals():
    sub = np.float16(2.0**-24)
    assert_ulp_close(np.float16(0.0), np.float16(-0.0), 0, "fp16")
    assert_ulp_close(sub, -sub, 2, "fp16")
    with pytest.raises(AssertionError, match="worst 2 ulp"):
        assert_ulp_close(sub, -sub, 1, "fp16")
    # the largest finite fp16 and inf are one step apart
    assert_ulp_close(np.float16(np.inf), np.float16(65504.0), 1, "fp16")


def test_ulp_close_failure_lists_the_worst_elements_with_their_ulp():
    expected = np.full((2, 3), 1.0, dtype=np.float16)
    actual = expected.copy()
    actual[1, 2] = np.float16(1.0 + 3 * 2.0**-10)  # 3 ulp above 1.0 (ulp(1) = 2**-10 in fp16)
    with pytest.raises(AssertionError) as info:
        assert_ulp_close(actual, expected, 2)  # format from the dtype
    message = str(info.value)
    assert "1 of 6 elements are farther, the worst 3 ulp" in message
    assert "(1, 2): 1.0029296875 vs 1.0, 3 ulp, ulp = 2**-10" in message
    assert "one ulp at 1.0 is 2**-10" in message


def test_ulp_close_nan_conventions():
    nan = np.float16(np.nan)
    assert_ulp_close(nan, nan, 0, "fp16")
    with pytest.raises(AssertionError, match="NaN against a number"):
        assert_ulp_close(nan, np.float16(1.0), 100, "fp16")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_ulp": -1}, "max_ulp must be a non-negative integer; received -1"),
        ({"max_ulp": 0.5}, "max_ulp must be a non-negative integer; received 0.5"),
        ({"format": "fp7"}, "format must be one of"),
    ],
)
def test_ulp_close_rejects_bad_arguments(kwargs, message):
    args = {"max_ulp": 1, "format": "fp16", **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        assert_ulp_close(np.float16(1.0), np.float16(1.0), args["max_ulp"], args["format"])


def test_ulp_close_rejects_unrepresentable_expected_with_advice():
    with pytest.raises(InvalidArgument, match=r"expected holds 1 value\(s\) not representable in fp16.*round it to fp16 first"):
        assert_ulp_close(np.float16(1.0), 1.0 + 2.0**-12, 1, "fp16")


def test_ulp_close_needs_a_format_for_unknown_dtypes():
    with pytest.raises(InvalidArgument, match="format must be given when actual has dtype int64"):
        assert_ulp_close(np.array([1]), np.array([1]), 0)


# --------------------------------------------------------------------------- assert_within_error_bound


def _swamped(count: int):
    """2048 followed by `count` ones, summed sequentially in fp16: stays 2048 (each 1 is half an ulp)."""
    a = np.array([2048.0] + [1.0] * count, dtype=np.float16)
    b = np.ones_like(a)
    computed = dot(a, b, parse_model("sequential:fp16"))
    exact = 2048.0 + count
    return computed, exact, count + 1


def test_error_bound_holds_for_fp16_accumulation_and_not_for_an_fp32_claim():
    computed, exact, k = _swamped(64)
    assert float(computed) == 2048.0  # stagnation: the error is 64 = K - 1
    # |error| = 64 <= gamma_65(2**-11) * 2112 = 65/2048 / (1 - 65/2048) * 2112 ~= 69.2
    assert_within_error_bound(computed, exact, k, "fp16", "deterministic")
    with pytest.raises(AssertionError) as info:
        assert_within_error_bound(computed, exact, k, "fp32", "deterministic")
    message = str(info.value)
    assert "not within the deterministic error bound of fp32 accumulation over K = 65" in message
    assert "2048.0 vs 2112.0, |error| 64 >" in message
    assert "u_fp16 + (1 + u_fp16) * [gamma_K(u) = K u / (1 - K u)]" in message  # output rounded to fp16


def test_error_bound_edge_is_exact():
    # reference 1.0, S = 1.0, K = 1, fp16 accumulation, no output rounding:
    # bound = gamma_1(2**-11) = 2**-11 / (1 - 2**-11); an error of 2**-11 is inside, 2**-10 is not.
    assert_within_error_bound(np.float64(1.0 + 2.0**-11), 1.0, 1, "fp16", output="fp64")
    with pytest.raises(AssertionError, match="1 of 1 elements exceed it"):
        assert_within_error_bound(np.float64(1.0 + 2.0**-10), 1.0, 1, "fp16", output="fp64")


def test_error_bound_probabilistic_and_blocked_kinds():
    computed, exact, k = _swamped(8)  # error 8, S = 2056
    # probabilistic: 3 sqrt(9) 2**-11 = 9/2048 -> u_out + (1+u_out) bound ~ 0.00488 * 2056 ~= 10.0 >= 8
    assert_within_error_bound(computed, exact, k, "fp16", "probabilistic")
    with pytest.raises(AssertionError, match=r"lambda sqrt\(K\) u with lambda = 1"):
        assert_within_error_bound(computed, exact, k, "fp16", "probabilistic", lam=1.0)
    assert_within_error_bound(computed, exact, k, "fp16", "blocked", block_size=1)
    with pytest.raises(InvalidArgument, match="block_size is required"):
        assert_within_error_bound(computed, exact, k, "fp16", "blocked")


def test_error_bound_uses_abs_sum_for_signed_terms():
    # 1 + 2**-11 - 1 in fp16: exact 2**-11, computed 0 (1 + 2**-11 ties to 1). |reference| is tiny,
    # so only the true S = sum |x_k w_k| ~ 2 makes the bound meaningful.
    a = np.array([1.0, 2.0**-11, -1.0], dtype=np.float16)
    computed = dot(a, np.ones_like(a), parse_model("sequential:fp16"))
    exact, s = 2.0**-11, 2.0 + 2.0**-11
    with pytest.raises(AssertionError, match=re.escape("S = |reference|")):
        assert_within_error_bound(computed, exact, 3, "fp16")
    assert_within_error_bound(computed, exact, 3, "fp16", abs_sum=s)


def test_error_bound_rejects_bad_arguments():
    with pytest.raises(InvalidArgument, match="kind must be one of deterministic, probabilistic, blocked; received 'worst'"):
        assert_within_error_bound(1.0, 1.0, 4, "fp16", "worst")
    with pytest.raises(InvalidArgument, match="K must be a positive integer"):
        assert_within_error_bound(1.0, 1.0, 0, "fp16")
    with pytest.raises(InvalidArgument, match="gamma_k needs k\\*u < 1"):
        assert_within_error_bound(1.0, 1.0, 4096, "fp16")


# --------------------------------------------------------------------------- assert_no_gradient_underflow


def _records(flushed_conv2: int = 0, lost_dense: int = 0) -> pd.DataFrame:
    rows = []
    for step in (0, 10):
        for layer, flushed, lost in (("conv1", 0, 0), ("stage1/conv2", flushed_conv2, 0), ("dense", 0, lost_dense)):
            for kind in ("weight", "activation"):
                rows.append({
                    "step": step, "loss_scale": 128.0, "kind": kind, "layer": layer, "n": 1000,
                    "routing_zero": 300, "flushed": flushed if kind == "activation" else 0,
                    "lost": lost if kind == "activation" else 0, "subnormal": 5,
                })
    return pd.DataFrame(rows)


def test_underflow_passes_when_nothing_is_flushed():
    assert_no_gradient_underflow(_records(0))


def test_underflow_tolerance_is_a_fraction_with_an_exact_edge():
    records = _records(10)  # stage1/conv2 activations: 20 of 2000 flushed = 0.01
    assert_no_gradient_underflow(records, tolerance=0.01)
    with pytest.raises(AssertionError) as info:
        assert_no_gradient_underflow(records, tolerance=0.0099)
    message = str(info.value)
    assert ("gradients underflowed in 1 of 6 (layer, kind) groups of all layers over steps 0..10, loss scale 128, "
            "worst stage1/conv2 activation") in message
    assert "stage1/conv2 activation: 20 / 2000 = 0.01; flushed 20, lost 0, subnormal 10, routing_zero 600" in message
    assert "routing zeros (ReLU, pooling) are not counted" in message


def test_underflow_counts_lost_values_by_default_and_one_class_on_request():
    """The README's underflow is flushed or lost: a run whose values were only lost fails by default."""
    records = _records(0, lost_dense=3)  # dense activations: 6 lost of 2000
    with pytest.raises(AssertionError) as info:
        assert_no_gradient_underflow(records)
    message = str(info.value)
    assert "worst dense activation: some of their values underflowed (flushed or lost) (6 of 12000 values" in message
    assert "dense activation: 6 / 2000 = 0.003; flushed 0, lost 6" in message
    assert_no_gradient_underflow(records, counting="flushed")
    with pytest.raises(AssertionError, match="lost / n"):
        assert_no_gradient_underflow(records, counting="lost")
    both = _records(4, lost_dense=1)  # stage1/conv2: 8 flushed; dense: 2 lost
    with pytest.raises(AssertionError) as info:
        assert_no_gradient_underflow(both)
    assert "2 of 6 (layer, kind) groups" in str(info.value)
    assert "worst stage1/conv2 activation, dense activation:" in str(info.value)
    with pytest.raises(AssertionError) as info:
        assert_no_gradient_underflow(both, counting="flushed")
    assert "1 of 6 (layer, kind) groups" in str(info.value) and "were flushed to zero (8 of" in str(info.value)
    with pytest.raises(InvalidArgument, match="counting must be one of underflow, flushed, lost; received 'subnormal'"):
        assert_no_gradient_underflow(both, counting="subnormal")
    with pytest.raises(InvalidArgument, match="missing lost"):
        assert_no_gradient_underflow(both.drop(columns="lost"))
    assert_no_gradient_underflow(both.drop(columns="lost"), counting="flushed", tolerance=0.004)
    bad = both.copy()
    bad.loc[0, ["flushed", "lost"]] = [600, 600]
    with pytest.raises(InvalidArgument, match="flushed \\+ lost must be at most n"):
        assert_no_gradient_underflow(bad)


def test_underflow_selects_layers_by_name_glob_and_kind():
    records = _records(10)
    assert_no_gradient_underflow(records, layer="conv1")
    assert_no_gradient_underflow(records, layer="stage1*", kind="weight")
    with pytest.raises(AssertionError, match="layer 'stage1\\*'"):
        assert_no_gradient_underflow(records, layer="stage1*")
    with pytest.raises(InvalidArgument, match="layer must name recorded layers; received 'conv9'; recorded layers: conv1, dense, stage1/conv2"):
        assert_no_gradient_underflow(records, layer="conv9")
    with pytest.raises(InvalidArgument, match="kind must be one of activation, weight; received 'bias'"):
        assert_no_gradient_underflow(records, kind="bias")


def test_underflow_reads_a_run_directory_and_row_dicts(tmp_path):
    records = _records(1)
    records.to_csv(tmp_path / "telemetry.csv", index=False)
    with pytest.raises(AssertionError, match="2 / 2000"):
        assert_no_gradient_underflow(tmp_path)
    with pytest.raises(AssertionError, match="2 / 2000"):
        assert_no_gradient_underflow(records.to_dict("records"))
    with pytest.raises(InvalidArgument, match="does not exist"):
        assert_no_gradient_underflow(tmp_path / "missing")
    with pytest.raises(InvalidArgument, match="missing flushed"):
        assert_no_gradient_underflow(records.drop(columns="flushed"))
    with pytest.raises(InvalidArgument, match="tolerance must be a fraction in \\[0, 1\\]"):
        assert_no_gradient_underflow(records, tolerance=2)


# --------------------------------------------------------------------------- assert_all_finite


def test_all_finite_counts_and_locates_non_finite_values():
    assert_all_finite(np.ones((2, 2), dtype=np.float16))
    y = np.array([[1.0, np.inf], [np.nan, -np.inf]], dtype=np.float16)
    with pytest.raises(AssertionError) as info:
        assert_all_finite(y, name="conv output")
    message = str(info.value)
    assert "conv output is not all finite: 3 of 4 elements are not (1 NaN, 1 +inf, 1 -inf; dtype float16)" in message
    assert "(0, 1): inf" in message and "(1, 0): nan" in message


def test_assertion_frames_are_hidden_from_tracebacks():
    import convprobe.testing.assertions as module

    for name in module.__all__:
        fn = getattr(module, name)
        if callable(fn):
            assert "__tracebackhide__" in fn.__code__.co_varnames, name


def test_underflow_reads_the_training_harness_schema(tmp_path):
    """A telemetry.csv with exactly the harness's columns (training.records.TELEMETRY_COLUMNS)."""
    from convprobe.training.records import TELEMETRY_COLUMNS

    row = {column: 0 for column in TELEMETRY_COLUMNS}
    row.update({"step": 0, "loss_scale": 1.0, "kind": "activation", "index": 0, "layer": "initial_conv",
                "n": 4096, "flushed": 3, "hist_low": "", "hist_shadow": ""})
    pd.DataFrame([row], columns=list(TELEMETRY_COLUMNS)).to_csv(tmp_path / "telemetry.csv", index=False)
    with pytest.raises(AssertionError, match="initial_conv activation: 3 / 4096 = 0.0007324"):
        assert_no_gradient_underflow(tmp_path)
    assert_no_gradient_underflow(tmp_path, tolerance=3 / 4096)
    row["lost"] = 1
    pd.DataFrame([row], columns=list(TELEMETRY_COLUMNS)).to_csv(tmp_path / "telemetry.csv", index=False)
    with pytest.raises(AssertionError, match="initial_conv activation: 4 / 4096"):
        assert_no_gradient_underflow(tmp_path, tolerance=3 / 4096)
    assert_no_gradient_underflow(tmp_path, tolerance=3 / 4096, counting="flushed")


@pytest.mark.parametrize("records", ["", "  ", Path("")])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(records, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "telemetry.csv").write_text("layer,n,flushed,lost\nconv,4,4,0\n")  # would fail if read
    if isinstance(records, Path):  # Path('') is '.': a name the user gave, read as such
        with pytest.raises(AssertionError, match="gradients underflowed"):
            assert_no_gradient_underflow(records)
        return
    with pytest.raises(InvalidArgument) as info:
        assert_no_gradient_underflow(records)
    assert str(info.value) == (f"records must be a DataFrame, a list of dicts, a telemetry.csv path or a run "
                               f"directory; received {records!r}")
