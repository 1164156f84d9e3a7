"""The study commands end to end (fingerprint, identify, sweep, report), emulator-backed unless marked.

They are called through `convprobe.cli.main`, in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from convprobe import cli
from convprobe.render import share_text
from convprobe.results import SCHEMA_VERSION


def main(*argv: str) -> int:
    return cli.main(list(argv))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One emulator-only result file of each kind (and the tidy CSVs)."""
    out = tmp_path_factory.mktemp("results")
    models = ("--model", "sequential:fp16", "--model", "sequential:fp32:output=fp16", "--model", "blocked:fp16:b=8")
    paths = {}
    for kind, extra in (
        ("fingerprint", ("--op", "conv2d,matmul")),
        ("identify", ("--op", "matmul", "--ks", "16,64,256")),
        ("sweep", ("--op", "conv2d", "--ks", "9,72,576,4608,18432", "--rows", "8")),
    ):
        for suffix in ("json", "csv"):
            paths[f"{kind}.{suffix}"] = out / f"{kind}.{suffix}"
            code = cli.main([kind, "--configs", "none", *models, *extra, "--output", str(paths[f"{kind}.{suffix}"])])
            assert code == 0
    return paths


def test_fingerprint_prints_one_row_per_configuration_and_op(capsys):
    assert main("fingerprint", "--configs", "none", "--model", "sequential:fp16", "--model", "a100",
                "--op", "matmul") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["configuration", "op", "accumulation", "acc"]
    assert lines[2].split()[:5] == ["emulated/sequential:fp16", "matmul", "fp16", "11", "0"]
    assert lines[3].split()[:5] == ["emulated/a100", "matmul", "fp32", "24", "1"]


def test_result_files_carry_schema_version_and_provenance(results):
    for kind in ("fingerprint", "identify", "sweep"):
        document = json.loads(results[f"{kind}.json"].read_text())
        assert (document["schema_version"], document["kind"]) == (SCHEMA_VERSION, kind)
        assert document["provenance"]["schema_version"] == SCHEMA_VERSION
        assert document["provenance"]["seed"] == 0
        assert all(r["provenance"]["versions"]["numpy"] for r in document["results"])
    header = results["sweep.csv"].read_text().splitlines()[0].split(",")
    assert header[:5] == ["schema_version", "backend", "configuration", "device", "op"] and "provenance" in header


def test_identify_file_names_the_model_per_k(results):
    document = json.loads(results["identify.json"].read_text())
    summary = document["matches"]["emulated/blocked:fp16:b=8"]["matmul"]["summary"]
    assert summary["best"] == "blocked:fp16:b=8"
    assert summary["fractions"] == {"16": 1.0, "64": 1.0, "256": 1.0}


@pytest.mark.parametrize("name", ["fingerprint.json", "fingerprint.csv", "identify.json", "identify.csv",
                                  "sweep.json", "sweep.csv"])
def test_report_renders_png_and_svg(results, tmp_path, capsys, name):
    assert main("report", str(results[name]), "--out-dir", str(tmp_path)) == 0
    written = capsys.readouterr().out.split()
    assert written and all(p.endswith((".png", ".svg")) for p in written)
    for path in written:
        with open(path, "rb") as handle:
            data = handle.read()
        assert data.startswith(b"\x89PNG") if path.endswith(".png") else b"<svg" in data[:2000]
    if name == "sweep.json":
        names = {path.rsplit("/", 1)[-1] for path in written}
        assert {"sweep-error-vs-k-conv2d-uniform01.png", "sweep-error-vs-k-conv2d-heavy_tailed.svg",
                "sweep-ulp-conv2d.png", "sweep-ulp-conv2d.svg"} <= names


@pytest.mark.parametrize("argv,message", [
    (("fingerprint", "--configs", "none", "--model", "sequential:fp16", "--op", "conv4d"),
     "op must be one of conv2d, conv2d_spatial"),
    (("fingerprint", "--configs", "default,turbo"), "configuration must be one of default, onednn-off"),
    (("identify", "--configs", "none", "--model", "sequentail:fp16"), "model must be one of"),
    (("identify", "--configs", "none", "--model", "sequential:fp16", "--candidates", "lanes:fp16:w=0"),
     "width must be an integer >= 1; received 0"),
    (("sweep", "--configs", "none", "--model", "sequential:fp16", "--distributions", "cauchy"),
     "distribution must be one of uniform01"),
    (("sweep", "--configs", "none"), "nothing to run"),
    (("fingerprint", "--configs", "none", "--model", "sequential:fp16", "--op", "matmul", "--output", "x.txt"),
     "output must end in .json or .csv"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main(*argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_report_refuses_foreign_or_old_results(tmp_path, results, capsys):
    old = json.loads(results["fingerprint.json"].read_text())
    old["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "other.json").write_text(json.dumps({"kind": "training", "schema_version": SCHEMA_VERSION}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    cases = {
        "old.json": f"schema_version {SCHEMA_VERSION + 1} is not one this convprobe reads (versions 1, 2;",
        "other.json": "kind must be one of overflow, compare, fingerprint, identify, contract, sweep, replay, train, "
                      "train-summary, train-comparison; received 'training'",
        "list.json": "a convprobe result must be a JSON object; received list",
        "bad.csv": "does not match the probe schema",
        "missing.json": "does not exist",
    }
    for name, message in cases.items():
        assert main("report", str(results["sweep.json"]), str(tmp_path / name), "--out-dir", str(tmp_path / "f")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (name, err)
    assert not (tmp_path / "f").exists()  # validated before any figure was drawn
    assert main("report", str(results["sweep.json"]), "--formats", "pdf") == 2
    assert "formats must be one of png, svg; received 'pdf'" in capsys.readouterr().err


def test_list_configs_says_the_gpu_switches_change_nothing_on_cpu(capsys):
    assert main("fingerprint", "--list-configs") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("* default ")
    assert "  gpu-switches " in out and "change nothing" in out


def test_help_does_not_import_tensorflow():
    code = (
        "import sys; from convprobe import cli\n"
        "for cmd in ('fingerprint', 'identify', 'sweep', 'report'):\n"
        "    try: cli.main([cmd, '--help'])\n"
        "    except SystemExit: pass\n"
        "print('tensorflow' in sys.modules, 'pandas' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False False"


@pytest.mark.parametrize("fraction, text", [
    (1.0, "100.0%"), (1 - 1 / 8640, "99.98%"), (0.99999, "99.99%"), (0.9989, "99.8%"), (0.982, "98.2%"),
    (0.5, "50.0%"), (0.0, "0.0%"),
])
def test_a_match_share_reads_100_percent_only_when_every_output_matched(fraction, text):
    """Shares are rounded down: one mismatching output in 8,640 (a conv's filter gradient) must
    not read as the 100.0% that means every output matched."""
    assert share_text(fraction) == text


@pytest.mark.parametrize("fraction, text", [
    (0.0, "0.0%"), (1 / 8640, "0.02%"), (0.00001, "0.01%"), (0.0011, "0.2%"), (0.5, "50.0%"), (1.0, "100.0%"),
])
def test_a_share_of_differing_elements_reads_0_percent_only_when_none_differs(fraction, text):
    assert share_text(fraction, up=True) == text
