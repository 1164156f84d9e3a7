"""The package surface: explicit __all__, and no pandas/matplotlib on a plain import."""

from __future__ import annotations

import subprocess
import sys

import convprobe.analysis as analysis


def test_every_public_name_resolves():
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name
    assert len(set(analysis.__all__)) == len(analysis.__all__)


def test_plain_import_stays_numpy_only():
    code = (
        "import sys, convprobe.analysis as a; a.ulp_distance(1.0, 2.0, 'fp16');"
        "print(sorted(m for m in ('pandas', 'matplotlib', 'tensorflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
