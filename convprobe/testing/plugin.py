"""pytest plugin: fixtures, markers, options and a report header with what numerical results depend on.

Loaded automatically (entry point `pytest11`) wherever convprobe is installed,
so importing it must stay cheap: no TensorFlow, pandas or hypothesis here, and
nothing changes for a test that does not ask for a fixture or marker.

- `rng`: a `numpy.random.Generator` seeded from `--convprobe-seed` (default 0)
  and the test's node id: reproducible, and different for each test.
- `conv_backend`: a `ConvBackend`, parametrised over backend configurations:
  the two emulated ones by default (in process, cheap); TensorFlow's
  default/fp16/fp32 configurations (each in a child process) with
  `--convprobe-backends=tensorflow` or `all`, or for one test with
  `@pytest.mark.conv_backends("tensorflow/cpu/fp16", "sequential:fp16")`;
  `--convprobe-backends=jax` or `torch` the same for JAX or PyTorch (their extras).
  A framework's cases carry its marker (`tensorflow`, `jax`, `torch`), so
  `-m "not tensorflow"` deselects TensorFlow's.
- `@pytest.mark.gpu`: skipped cleanly when no NVIDIA GPU is visible (checked
  without importing any framework).

A bad option or ini value stops the run with pytest's usage error (exit 4) before
any test; a bad `conv_backends` argument, or a misspelt name of one of these
markers, is a collection error of that test naming it, not a traceback.
"""

from __future__ import annotations

import difflib
import zlib

import pytest

from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.testing.backends import BACKEND_SELECTIONS, ConvBackend, available_configs, resolve_target

#: The largest seed (the CLI's --seed allows the same range).
_MAX_SEED = 2**63 - 1

_MARKERS = (
    "gpu: needs a GPU; skipped cleanly without one (convprobe)",
    "tensorflow: runs real TensorFlow (in-process or in child processes) (convprobe)",
    "jax: runs real JAX (in child processes) (convprobe)",
    "torch: runs real PyTorch (in child processes) (convprobe)",
    "conv_backends(*backends): the configurations the conv_backend fixture runs over for this test, "
    "as labels ('tensorflow/cpu/fp16'), model specs ('sequential:fp16') or BackendConfigs (convprobe)",
)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("convprobe", "convprobe numerical testing")
    group.addoption(
        "--convprobe-backends", action="store", default=None, choices=BACKEND_SELECTIONS,
        help="configurations for the conv_backend fixture: emulated (default; in process), "
        "tensorflow, jax or torch (default/fp16/fp32, one child process each), or all (the emulator and "
        "every installed framework)",
    )
    group.addoption(
        "--convprobe-seed", action="store", default=None, metavar="SEED",
        help="base seed of the rng fixture, 0 to 2**63 - 1 (default 0)",
    )
    parser.addini("convprobe_backends", "default for --convprobe-backends", default="emulated")
    parser.addini("convprobe_seed", "default for --convprobe-seed", default="0")


def pytest_configure(config) -> None:
    for line in _MARKERS:
        config.addinivalue_line("markers", line)
    _base_seed(config)  # a bad value is a usage error now, not an error in every test that uses rng
    try:
        available_configs(_selection(config), device="cpu")  # a framework that is not installed: refused now
    except InvalidArgument as exc:
        raise pytest.UsageError(str(exc)) from None


def _base_seed(config) -> int:
    """--convprobe-seed, else the convprobe_seed ini value, else 0: an integer from 0 to 2**63 - 1."""
    value, source = config.getoption("convprobe_seed", None), "--convprobe-seed"
    if value is None:
        value, source = config.getini("convprobe_seed"), "ini value convprobe_seed"
    text = str(value).strip()
    if text == "":
        return 0
    try:
        seed = int(text, 10)
    except ValueError:
        seed = None
    if seed is None or not 0 <= seed <= _MAX_SEED:
        raise pytest.UsageError(f"{source} must be an integer from 0 to 2**63 - 1; received {value!r}")
    return seed


def _selection(config) -> str:
    """--convprobe-backends, else the convprobe_backends ini value, else emulated."""
    value = config.getoption("convprobe_backends", None)
    if value is None:
        value = str(config.getini("convprobe_backends")).strip() or "emulated"
        if value not in BACKEND_SELECTIONS:
            raise pytest.UsageError(str(invalid_choice("ini value convprobe_backends", value, BACKEND_SELECTIONS)))
    return str(value)


def pytest_report_header(config) -> list[str]:
    from convprobe import provenance

    versions = provenance.package_versions()
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    flags = " ".join(provenance.cpu_flags()) or "none reported"
    identity = " ".join(f"{k} {v}" for k, v in provenance.cpu_identity().items()) or "no identity reported"
    caches = " ".join(f"{name} {size // 1024}K" for name, size in provenance.cpu_caches().items()) or "none reported"
    return [
        f"convprobe: {shown}",
        f"convprobe: cpu {provenance.cpu_model()} ({identity}); flags {flags}; caches {caches}",
        f"convprobe: rng base seed {_base_seed(config)}; conv_backend over {_selection(config)} configurations",
    ]


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from the base seed and this test's node id (same test, same bits)."""
    import numpy as np

    key = zlib.crc32(request.node.nodeid.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence([_base_seed(request.config), key]))


def pytest_generate_tests(metafunc) -> None:
    _check_marker_names(metafunc)
    if "conv_backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("conv_backends")
    if marker is not None:
        configs = _marked_configs(marker, metafunc.definition.nodeid)
    else:
        configs = available_configs(_selection(metafunc.config))
    framework_marks = {"tensorflow": pytest.mark.tensorflow, "jax": pytest.mark.jax, "torch": pytest.mark.torch}
    params = [pytest.param(c, id=c.label, marks=[framework_marks[c.backend]] if c.backend in framework_marks else [])
              for c in configs]
    metafunc.parametrize("conv_backend", params, indirect=True)


def _marked_configs(marker, nodeid: str) -> list:
    """The configurations a `conv_backends(...)` marker names; a collection error naming the test
    and the argument otherwise (pytest's way for a bad parametrisation)."""
    if marker.kwargs:
        pytest.fail(f"In {nodeid}: conv_backends takes the backends as positional arguments; received the "
                    f"keyword(s) {', '.join(marker.kwargs)}", pytrace=False)
    if not marker.args:
        pytest.fail(f"In {nodeid}: conv_backends needs at least one backend (a label such as "
                    f"'tensorflow/cpu/fp16' or a model spec such as 'sequential:fp16')", pytrace=False)
    configs = []
    for i, target in enumerate(marker.args):
        try:
            configs.append(resolve_target(target))
        except InvalidArgument as exc:
            problem = f"In {nodeid}: conv_backends argument {i + 1}: {exc}"
            break
    else:
        return configs
    pytest.fail(problem, pytrace=False)  # outside the except: no "during handling" chain in the report


def _check_marker_names(metafunc) -> None:
    """A collection error for a marker that is not registered and is one typo away from one of
    ours: without --strict-markers, `@pytest.mark.conv_backend(...)` would only warn and the test
    would silently run over the default configurations."""
    registered = {line.split(":")[0].split("(")[0].strip() for line in metafunc.config.getini("markers")}
    ours = [line.split(":")[0].split("(")[0] for line in _MARKERS]
    for mark in metafunc.definition.iter_markers():
        if mark.name in registered:
            continue
        close = difflib.get_close_matches(mark.name, ours, n=1, cutoff=0.75)
        if close:
            pytest.fail(f"In {metafunc.definition.nodeid}: unknown marker {mark.name!r}; did you mean "
                        f"{close[0]!r} (convprobe)?", pytrace=False)


@pytest.fixture
def conv_backend(request):
    """The backend configuration under test, as a `convprobe.testing.ConvBackend`."""
    config = getattr(request, "param", None)
    if config is None:  # requested indirectly (e.g. by another fixture) without parametrisation
        config = available_configs(_selection(request.config))[0]
    return ConvBackend(config)


def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    from convprobe.backends.configurations import gpu_visible

    if not gpu_visible():
        pytest.skip("needs a GPU: no NVIDIA GPU is visible on this machine")
