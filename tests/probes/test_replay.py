"""`convprobe replay`: the bundled real tensor-core vectors, bit for bit, and directories in
the source data's layout (other vectors, other GPU names of the same families)."""

import json
import os

import numpy as np
import pytest

from conftest import run_cli
from convprobe.probes import replay


def _write_layout(root, sets, rows, rename=None):
    """Write `sets` (their `rows`) as GPU/FORMAT/ text files in the source data's layout."""
    folders = {"fp8_e4m3": "E4M3", "fp8_e5m2": "E5M2"}
    for s in sets:
        gpu = (rename or {}).get(s.gpu, s.gpu)
        fmt = folders.get(s.input, s.input)
        where = root / gpu / fmt
        where.mkdir(parents=True, exist_ok=True)
        for name, arr in (("a", s.a), ("b", s.b)):
            lines = [" ".join(f"{int(v):08x}" for v in row) + " " for row in arr[rows]]
            (where / f"{name}_{gpu}_{fmt}.txt").write_text("\n".join(lines) + "\n")
        (where / f"c_{gpu}_fp32.txt").write_text("".join(f"{int(v):032b}\n" for v in s.c[rows]))
        (where / f"d_{gpu}_{s.output}.txt").write_text("".join(f"{int(v):032b}\n" for v in s.d[rows]))


@pytest.fixture(scope="module")
def bundled():
    return replay.load_bundled()


def test_the_bundle_holds_all_30_sets_of_2500_vectors(bundled):
    assert len(bundled) == 30 and {s.vectors for s in bundled} == {2500}
    assert {s.gpu for s in bundled} == {"V100", "A100", "Ada", "H100", "B200"}
    assert sum(s.output == "fp16" for s in bundled) == 11
    for s in bundled:  # inputs are exactly numbers of their format (the data's claim)
        assert s.a.dtype == np.uint32 and s.a.shape == s.b.shape


def test_every_bundled_set_replays_bit_for_bit(bundled):
    rows = replay.replay(bundled)
    assert [(r["gpu"], r["input"], r["output"]) for r in rows if r["matches"] != r["vectors"]] == []
    assert sum(r["matches"] for r in rows) == 75000


def test_cli_replay_exits_0_with_every_set_in_the_table():
    proc = run_cli("replay")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "30 of 30 sets bit-exact; 75000 of 75000 vectors"


def test_other_vectors_and_other_gpus_of_the_families_from_a_directory(tmp_path, bundled):
    """Odd rows only, under A30, H200 and L40S folder names (which share the A100, H100 and
    Ada models), read from the text layout: every vector still matches."""
    picked = [s for s in bundled if s.gpu in ("A100", "H100", "Ada")]
    _write_layout(tmp_path, picked, slice(1, None, 7), rename={"A100": "a30", "H100": "H200", "Ada": "L40S"})
    proc = run_cli("replay", "--data", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["results"]
    assert {r["gpu"] for r in rows} == {"a30", "H200", "L40S"} and len(rows) == len(picked)
    assert all(r["matches"] == r["vectors"] == len(range(1, 2500, 7)) for r in rows)
    assert {"gpu", "input", "output", "model", "vectors", "matches"} <= set(rows[0])


def test_a_changed_output_bit_fails_with_the_first_mismatch(tmp_path, bundled):
    (s,) = [s for s in bundled if (s.gpu, s.input, s.output) == ("V100", "fp16", "fp32")]
    d = s.d.copy()
    d[3] ^= 1
    _write_layout(tmp_path, [replay.VectorSet(s.gpu, s.preset, s.input, s.output, s.a, s.b, s.c, d)],
                  slice(0, 10))
    proc = run_cli("replay", "--data", str(tmp_path), "--format", "json")
    assert proc.returncode == 1
    (row,) = json.loads(proc.stdout)["results"]
    assert (row["vectors"], row["matches"]) == (10, 9)
    assert row["first_mismatch"] == {"index": 3, "model": f"0x{int(s.d[3]):08x}",
                                     "hardware": f"0x{int(d[3]):08x}"}


def test_gpu_filter_takes_folder_or_preset_names():
    proc = run_cli("replay", "--gpu", "v100,B200", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert {line.split(",")[0] for line in proc.stdout.splitlines()[1:]} == {"V100", "B200"}


@pytest.mark.parametrize("layout,message", [
    ({"T4/fp16": "x"}, "GPU folder 'T4' must be one of v100, a100, a2, a30, ada, l40s, h100, h200, b200; received 'T4'"),
    ({"A100/int8": "x"}, "format folder A100/int8 must be one of fp16, bf16, tf32, e4m3, e5m2; received 'int8'"),
    ({"A100/fp16": "x"}, "fp16 lacks a_A100_fp16.txt, b_A100_fp16.txt, c_A100_fp32.txt"),
])
def test_unknown_folders_and_missing_files_are_one_line_with_exit_2(tmp_path, layout, message):
    for folder in layout:
        (tmp_path / folder).mkdir(parents=True)
    proc = run_cli("replay", "--data", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("convprobe replay: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_malformed_files_and_bad_options_are_refused_before_work(tmp_path, bundled):
    (s,) = [s for s in bundled if (s.gpu, s.input, s.output) == ("V100", "fp16", "fp32")]
    _write_layout(tmp_path, [s], slice(0, 4))
    (tmp_path / "V100" / "fp16" / "c_V100_fp32.txt").write_text("0101\n")
    cases = [
        (["--data", str(tmp_path)], "must hold one 32-character 0/1 bit string per line"),
        (["--data", str(tmp_path / "nowhere")], "--data must be a directory"),
        (["--gpu", ","], "--gpu must name at least one GPU"),
        (["--gpu", "t4"], "no bundled vector sets for --gpu t4"),
        (["--format", "csv", "--output", str(tmp_path / "o.json")], "ends in .json but the output format is csv"),
        (["--output", str(tmp_path)], "--output must be a file path"),
    ]
    for args, message in cases:
        proc = run_cli("replay", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not os.path.exists(tmp_path / "o.json")


def test_output_file_holds_the_document_with_provenance(tmp_path):
    out = tmp_path / "replay.json"
    proc = run_cli("replay", "--gpu", "V100", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    assert document["kind"] == "replay" and "versions" in document["provenance"]
    assert [r["matches"] for r in document["results"]] == [2500, 2500]
