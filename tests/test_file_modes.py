"""Files convprobe writes follow the umask (0666 less it), as a plain open() would, including
those written atomically through a temporary file (whose mkstemp mode is 0600)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from convprobe.render import write_atomic

REPO = Path(__file__).resolve().parents[1]


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.rglob("*") if p.is_file()}


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_follow_the_umask_also_over_an_existing_file(tmp_path, umask, mode):
    path = tmp_path / "out.json"
    path.write_text("old")
    os.chmod(path, 0o644)
    old = os.umask(umask)
    try:
        write_atomic(str(path), "new")
    finally:
        os.umask(old)
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == mode


def test_every_file_of_a_command_is_0644_under_umask_022(tmp_path):
    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "convprobe", *args], capture_output=True, text=True,
                              cwd=REPO, stdin=subprocess.DEVNULL, timeout=600,
                              preexec_fn=lambda: os.umask(0o022))
        assert proc.returncode == 0, proc.stderr

    run("replay", "--gpu", "v100", "--output", str(tmp_path / "replay.json"))
    run("overflow", "--backend", "emulated", "--model", "a100", "--format", "csv",
        "--output", str(tmp_path / "overflow.csv"))
    run("fingerprint", "--configs", "none", "--model", "v100", "--op", "matmul",
        "--output", str(tmp_path / "fingerprint.json"))
    run("report", str(tmp_path / "fingerprint.json"), "--out-dir", str(tmp_path / "figures"))
    modes = _modes(tmp_path)
    assert len(modes) >= 4 and set(modes.values()) == {0o644}, modes
