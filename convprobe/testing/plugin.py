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
  `@pytest.mark.conv_backends("tensorflow/cpu/fp16", "sequential:fp16")`.
  TensorFlow cases carry the `tensorflow` marker, so `-m "not tensorflow"`
  deselects them.
- `@pytest.mark.gpu`: skipped cleanly when no NVIDIA GPU is visible (checked
  without importing any framework).
"""

from __future__ import annotations

import zlib

import pytest

_MARKERS = (
    "gpu: needs a GPU; skipped cleanly without one (convprobe)",
    "tensorflow: runs real TensorFlow (in-process or in child processes) (convprobe)",
    "conv_backends(*backends): the configurations the conv_backend fixture runs over for this test, "
    "as labels ('tensorflow/cpu/fp16'), model specs ('sequential:fp16') or BackendConfigs (convprobe)",
)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("convprobe", "convprobe numerical testing")
    group.addoption(
        "--convprobe-backends", action="store", default=None, choices=("emulated", "tensorflow", "all"),
        help="configurations for the conv_backend fixture: emulated (default; in process), "
        "tensorflow (default/fp16/fp32, one child process each) or all",
    )
    group.addoption(
        "--convprobe-seed", action="store", type=int, default=None,
        help="base seed of the rng fixture (default 0)",
    )
    parser.addini("convprobe_backends", "default for --convprobe-backends", default="emulated")
    parser.addini("convprobe_seed", "default for --convprobe-seed", default="0")


def pytest_configure(config) -> None:
    for line in _MARKERS:
        config.addinivalue_line("markers", line)


def _base_seed(config) -> int:
    value = config.getoption("convprobe_seed", None)
    if value is None:
        value = int(config.getini("convprobe_seed") or 0)
    return int(value)


def _selection(config) -> str:
    value = config.getoption("convprobe_backends", None) or config.getini("convprobe_backends") or "emulated"
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
    if "conv_backend" not in metafunc.fixturenames:
        return
    from convprobe.testing.backends import available_configs, resolve_target

    marker = metafunc.definition.get_closest_marker("conv_backends")
    if marker is not None and marker.args:
        configs = [resolve_target(target) for target in marker.args]
    else:
        configs = available_configs(_selection(metafunc.config))
    params = [
        pytest.param(c, id=c.label, marks=(pytest.mark.tensorflow,) if c.backend == "tensorflow" else ())
        for c in configs
    ]
    metafunc.parametrize("conv_backend", params, indirect=True)


@pytest.fixture
def conv_backend(request):
    """The backend configuration under test, as a `convprobe.testing.ConvBackend`."""
    from convprobe.testing.backends import ConvBackend

    config = getattr(request, "param", None)
    if config is None:  # requested indirectly (e.g. by another fixture) without parametrisation
        from convprobe.testing.backends import available_configs

        config = available_configs(_selection(request.config))[0]
    return ConvBackend(config)


def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    from convprobe.backends.configurations import gpu_visible

    if not gpu_visible():
        pytest.skip("needs a GPU: no NVIDIA GPU is visible on this machine")
