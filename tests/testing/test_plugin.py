"""The plugin as a user meets it: a test file outside the package, run by pytest in a fresh process.

The plugin is loaded through its `pytest11` entry point (nothing in the user's
files mentions it), so these tests also check the packaging.
"""

from __future__ import annotations

import re

import pytest

from convprobe.backends.configurations import framework_installed
from convprobe.errors import InvalidArgument
from convprobe.testing import ConvBackend, assert_accumulates_in, resolve_target

#: A user's test file that uses only the public API and makes true claims.
USER_TESTS_TRUE = '''
import numpy as np
from hypothesis import given, settings

from convprobe.testing import (
    assert_accumulates_in, assert_all_finite, assert_ulp_close, assert_within_error_bound,
)
from convprobe.testing.strategies import adversarial_dots, fp16_arrays


def conv_fp64(x, w):
    """My own float64 reference: VALID, stride 1, NHWC x HWIO."""
    kh, kw = w.shape[:2]
    out = np.zeros((x.shape[0], x.shape[1] - kh + 1, x.shape[2] - kw + 1, w.shape[3]))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i:i + out.shape[1], j:j + out.shape[2], :].astype(np.float64)
            out += np.einsum("nhwc,co->nhwo", patch, w[i, j].astype(np.float64))
    return out


def test_fp32_accumulating_model_accumulates_in_fp32():
    assert_accumulates_in("sequential:fp32", "fp32", compare_params={"batch": 2})


def test_conv_stays_within_the_fp16_accumulation_bound(conv_backend, rng):
    x = rng.uniform(0, 1, (2, 6, 6, 4)).astype(np.float16)
    w = rng.uniform(0, 1, (3, 3, 4, 2)).astype(np.float16)
    y = conv_backend.conv2d(x, w)
    assert_all_finite(y, name=conv_backend.label)
    assert_within_error_bound(y, conv_fp64(x, w), K=3 * 3 * 4, accumulate="fp16", kind="deterministic")


@settings(max_examples=20, deadline=None)
@given(fp16_arrays(8, min_value=-4.0, max_value=4.0))
def test_doubling_is_exact_in_fp16(a):
    assert_ulp_close(a * np.float16(2), a.astype(np.float64) * 2, 0, "fp16")


@settings(max_examples=10, deadline=None)
@given(adversarial_dots("fp16", kind="swamping", max_k=16))
def test_fp32_accumulation_survives_swamping(case):
    from convprobe.backends import EmulatedBackend

    x, w = case.as_conv()  # fp16 in, fp16 out, fp32 accumulation: one rounding of the exact sum
    y = EmulatedBackend("sequential:fp32").conv2d(x, w)
    assert_ulp_close(y.ravel(), [np.float16(case.exact)], 0, "fp16")
'''

#: The same user's claims, wrong: each must fail with a message that explains the numbers.
USER_TESTS_FALSE = '''
import numpy as np
from convprobe.testing import assert_accumulates_in, assert_ulp_close


def test_fp16_accumulating_model_accumulates_in_fp32():
    assert_accumulates_in("sequential:fp16", "fp32", compare_params={"batch": 2})


def test_one_plus_three_ulps_is_within_two():
    assert_ulp_close(np.float16(1.0 + 3 * 2.0**-10), np.float16(1.0), 2, "fp16")
'''


def _run(pytester, source: str, *args: str):
    pytester.makepyfile(test_user=source)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", *args)


def test_a_users_true_claims_pass(pytester):
    result = _run(pytester, USER_TESTS_TRUE, "-v")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([
        "convprobe: cpu * (*); flags *; caches *",
        "convprobe: rng base seed 0; conv_backend over emulated configurations",
        "*test_conv_stays_within_the_fp16_accumulation_bound?emulated/sequential:fp16? PASSED*",
        "*test_conv_stays_within_the_fp16_accumulation_bound?emulated/sequential:fp32? PASSED*",
    ])


def test_a_users_wrong_claims_fail_with_readable_messages(pytester):
    result = _run(pytester, USER_TESTS_FALSE)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "E*AssertionError: emulated/sequential:fp16 does not accumulate in fp32*",
        "E*overflow probe (65519 test): fp16 - [[]inf, inf, inf] -> fp16 accumulator, exact products*",
        "E*the first partial sum 4.291e+09 overflowed an fp16 accumulator (max 65504) to inf",
        "*",
        "E*AssertionError: actual is not within 2 ulp of expected in fp16: 1 of 1 elements are farther, the worst 3 ulp.",
        "E*(): 1.0029296875 vs 1.0, 3 ulp, ulp = 2**-10",
    ])
    # The helpers hide their own frames: the traceback ends in the user's line.
    assert "convprobe/testing/assertions.py" not in result.stdout.str()


@pytest.mark.tensorflow
def test_a_users_true_claim_about_real_tensorflow_passes(pytester):
    """Real TensorFlow on this CPU: both probes in child processes with the configuration's environment."""
    source = '''
from convprobe.testing import assert_accumulates_in

def test_fp16_request_accumulates_in_fp16():
    assert_accumulates_in("tensorflow/cpu/fp16", "fp16", compare_params={"batch": 2})
'''
    _run(pytester, source).assert_outcomes(passed=1)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_users_wrong_claim_about_real_tensorflow_fails_readably(pytester):
    source = '''
from convprobe.testing import assert_accumulates_in

def test_fp16_request_accumulates_in_fp32():
    assert_accumulates_in("tensorflow/cpu/fp16", "fp32", compare_params={"batch": 2})
'''
    result = _run(pytester, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*AssertionError: tensorflow/cpu/fp16 does not accumulate in fp32: it accumulates in fp16.",
        "E*overflow probe (65519 test): fp16 - [[]inf, inf, inf] -> fp16 accumulator*",
        "E*compare probe (real vs fake fp16): fp16 - differs: accumulation below fp32",
        "E*configuration: tensorflow/cpu/fp16; environment TF_CONV2D_USE_FP16_ACCUMULATE=1 TF_ENABLE_ONEDNN_OPTS=0*",
    ])


def test_conv_backend_ids_and_selection(pytester):
    pytester.makepyfile(test_ids='''
import pytest

def test_default(conv_backend):
    pass

@pytest.mark.conv_backends("blocked:fp16:b=4", "tensorflow/cpu/fp16/jit")
def test_chosen(conv_backend):
    pass
''')
    default = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    default.stdout.fnmatch_lines([
        "test_ids.py::test_default[[]emulated/sequential:fp16[]]",
        "test_ids.py::test_default[[]emulated/sequential:fp32[]]",
        "test_ids.py::test_chosen[[]emulated/blocked:fp16:b=4[]]",
        "test_ids.py::test_chosen[[]tensorflow/cpu/fp16/jit[]]",
    ])
    everything = pytester.runpytest(
        "--collect-only", "-q", "-p", "no:cacheprovider", "--convprobe-backends=all", "-m", "tensorflow",
    )
    # test_default over the emulator's 2 and every installed framework's 3 requests, test_chosen over 2
    total = 2 + 3 * sum(framework_installed(name) for name in ("tensorflow", "jax", "torch")) + 2
    everything.stdout.fnmatch_lines([
        "test_ids.py::test_default[[]tensorflow/cpu/fp16[]]",
        "test_ids.py::test_default[[]tensorflow/cpu/fp32[]]",
        "test_ids.py::test_default[[]tensorflow/cpu/default[]]",
        "test_ids.py::test_chosen[[]tensorflow/cpu/fp16/jit[]]",
        f"4/{total} tests collected ({total - 4} deselected)*",
    ])


def test_rng_is_seeded_per_test_and_by_option(pytester):
    pytester.makepyfile(test_rng='''
def test_a(rng):
    print("DRAW a", rng.integers(0, 2**62))

def test_b(rng):
    print("DRAW b", rng.integers(0, 2**62))
''')

    def draws(*args):
        out = pytester.runpytest("-s", "-p", "no:cacheprovider", *args).stdout.str()
        return dict(re.findall(r"DRAW (\w) (\d+)", out))

    first, again, other = draws(), draws(), draws("--convprobe-seed=7")
    assert first == again  # same seed, same bits
    assert first["a"] != first["b"]  # each test its own stream
    assert other["a"] != first["a"] and other["b"] != first["b"]


def test_gpu_marker_skips_cleanly_without_a_gpu(pytester):
    from convprobe.backends.configurations import gpu_visible

    pytester.makepyfile(test_gpu='''
import pytest

@pytest.mark.gpu
def test_needs_gpu():
    pass
''')
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider", "--strict-markers")
    if gpu_visible():
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(["*needs a GPU: no NVIDIA GPU is visible on this machine*"])


def test_resolve_target_accepts_every_documented_form():
    from convprobe.backends import EmulatedBackend
    from convprobe.backends.configurations import emulated_config
    from convprobe.emulation import parse_model

    assert resolve_target("tensorflow").label == "tensorflow/cpu/default"
    assert resolve_target("tensorflow/cpu/fp16").env == {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CONV2D_USE_FP16_ACCUMULATE": "1"}
    assert resolve_target("tensorflow/cpu/fp32/jit").jit_compile is True
    strict = resolve_target("tensorflow/cpu/jit+strict")  # a configuration-matrix row, as fingerprint labels it
    assert strict.label == "tensorflow/cpu/jit+strict" and strict.jit_compile is True
    assert strict.env == {"XLA_FLAGS": "--xla_cpu_strict_dot_conv_math=true"}
    assert resolve_target("emulated/sequential:fp16").label == "emulated/sequential:fp16"
    assert resolve_target("a100").model == parse_model("a100")
    assert resolve_target(parse_model("pairwise:bf16")).label == "emulated/pairwise:bf16"
    assert resolve_target(EmulatedBackend("chunked:fp16:n=8")).label == "emulated/chunked:fp16:n=8"
    config = emulated_config("sequential:fp16", "fp16")
    assert resolve_target(config) is config
    assert resolve_target(ConvBackend(config)) is config
    for bad, message in (
        ("tensorflow/cpu/fp8", "accumulate in 'tensorflow/cpu/fp8' must be one of fp16, fp32, default or a configuration matrix row .*; received 'fp8'"),
        ("tensorflow/tpu", "device must be one of cpu, gpu, auto; received 'tpu'"),
        ("quantum:fp16", "backend must be .*received 'quantum:fp16'"),
        (3, "backend must be .*received int 3"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            resolve_target(bad)


def test_accumulates_in_rejects_an_unknown_accumulation():
    with pytest.raises(InvalidArgument, match="accumulate must be one of fp16, fp32; received 'bf16'"):
        assert_accumulates_in("sequential:fp32", "bf16")


def test_accumulates_in_returns_the_probe_results():
    results = assert_accumulates_in("sequential:fp32", "fp32", compare_params={"batch": 2})
    assert [r.probe for r in results] == ["overflow", "compare"]
    assert all(r.status == "ok" and r.accumulation == "fp32" for r in results)
    assert results[0].provenance["schema_version"] >= 1


def test_accumulates_in_passes_for_the_model_it_was_given():
    assert_accumulates_in("sequential:fp16", "fp16", compare_params={"batch": 2})


@pytest.mark.parametrize("spec,accumulation", [("blocked:fp16:b=4", "fp16"), ("v100:out=fp16", "fp16"),
                                               ("a100", "fp32"), ("h100", "fp32")])
def test_accumulates_in_agrees_with_the_probes_on_block_fma_models(spec, accumulation):
    """The overflow probe's spread test names an fp16 block accumulator (inf once the products are
    a block apart); a truncating fp32 block FMA stays within the fp32 block bound of compare."""
    assert_accumulates_in(spec, accumulation, compare_params={"batch": 2})


def test_accumulates_in_says_when_the_probes_disagree():
    """A block of 128 fp16 products is longer than the spread test's 64 positions (overflow sees 0
    at every distance, as wide accumulation would) while compare sees fp16 errors."""
    with pytest.raises(AssertionError) as info:
        assert_accumulates_in("blocked:fp16:b=128", "fp16", compare_params={"batch": 2})
    message = str(info.value)
    assert message.startswith(
        "emulated/blocked:fp16:b=128 does not accumulate in fp16: the probes disagree (overflow says fp32, compare says fp16)."
    )
    assert "compare probe (real vs fake fp16): fp16 - differs: accumulation below fp32" in message


@pytest.mark.slow
@pytest.mark.torch
def test_conv_backend_runs_pytorch_in_its_own_process(pytester):
    """--convprobe-backends=torch: PyTorch's three requests, each marked torch, each conv2d in a
    child process, and a claim about PyTorch checked on its real output."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    pytester.makepyfile(test_torch='''
import numpy as np

def test_sums_hold_wide(conv_backend):
    x = np.array([65504, 65504], np.float16).reshape(1, 1, 1, 2)
    w = np.array([65504, -65504], np.float16).reshape(1, 1, 2, 1)
    assert conv_backend.label.startswith("torch/cpu/")
    assert float(conv_backend.conv2d(x, w).ravel()[0]) == 0.0  # the 65519 test: products held wide
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--convprobe-backends=torch", "-m", "torch", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_sums_hold_wide?torch/cpu/fp16? PASSED*"])


def test_a_framework_that_is_not_installed_is_a_usage_error(pytester, monkeypatch):
    """Named on the command line, a framework without its extra stops the run before any test."""
    import convprobe.testing.backends as backends

    real = backends.framework_installed
    monkeypatch.setattr(backends, "framework_installed", lambda name: name != "torch" and real(name))
    with pytest.raises(InvalidArgument, match="convprobe-backends torch needs the torch extra"):
        backends.available_configs("torch")
    assert all(c.backend != "torch" for c in backends.available_configs("all"))
