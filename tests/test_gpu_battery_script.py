"""scripts/gpu_battery.py end to end on the CPU (the GPU machine runs the same commands with
--device gpu): every command exits 0, its documents are written, and the page is built from them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.torch
def test_the_battery_script_runs_and_its_page_is_built_from_what_it_wrote(tmp_path):
    pytest.importorskip("torch", reason="the torch extra is not installed")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_battery.py"), "--output", str(out), "--device",
                           "cpu", "--frameworks", "torch", "--layer", "1,5,5,6 3,3,6,4"], capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    commands = json.loads((out / "commands.json").read_text())
    assert [c["returncode"] for c in commands] == [0, 0, 0]
    assert {p.name for p in out.glob("*.json")} == {"commands.json", "contract.json", "fingerprint-torch.json",
                                                    "identify-torch.json"}
    page = tmp_path / "page.md"
    built = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_battery.py"), "--page", str(out), "--to",
                            str(page)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    text = page.read_text()
    assert "This run is on the CPU, not a GPU" in text and "| torch/cpu/fp16 | - | conv2d | fp16 | fp32 |" in text
    assert "## identify, torch" in text and "| torch/cpu/mkldnn-off | conv2d |" in text


def test_the_battery_script_refuses_to_guess_what_to_do():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_battery.py")], capture_output=True, text=True)
    assert proc.returncode == 2 and "give exactly one of --output (run) and --page" in proc.stderr
