"""`convprobe report` draws every kind of result, and refuses a malformed one of each kind in one
line before writing anything (the training-run case lives in tests/training/test_report_run.py)."""

from __future__ import annotations

import json

import pytest

from convprobe import cli

KINDS = {
    "overflow": ["overflow", "--backend", "emulated"],
    "compare": ["compare", "--backend", "emulated", "--batch", "2", "--height", "6", "--width", "6",
                "--channels", "4", "--filters", "2"],
    "replay": ["replay", "--gpu", "v100"],
}

#: One damage per kind, and the field the one-line refusal must name.
DAMAGE = {
    "overflow": (lambda d: d["results"][0]["observed"].update(output=[1, 2]), "results[0].observed.output"),
    "compare": (lambda d: d["results"][0]["observed"]["real"].pop("max_ulp_error"),
                "results[0].observed.real.max_ulp_error is missing"),
    "replay": (lambda d: d["results"][0].update(vectors="many"), "results[0].vectors"),
}


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    out = tmp_path_factory.mktemp("documents")
    paths = {}
    for kind, argv in KINDS.items():
        paths[kind] = out / f"{kind}.json"
        assert cli.main([*argv, "--output", str(paths[kind])]) in (0, 1)
    return paths


def test_report_draws_every_kind(documents, tmp_path, capsys):
    assert cli.main(["report", *map(str, documents.values()), "--out-dir", str(tmp_path / "f"),
                     "--formats", "png"]) == 0
    written = {line.rsplit("/", 1)[-1] for line in capsys.readouterr().out.split()}
    assert {"overflow-table.png", "compare-table.png", "compare-ulp.png", "replay-match.png"} <= written
    assert all((tmp_path / "f" / name).stat().st_size > 1000 for name in written)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_malformed_document_of_each_kind_is_one_line_and_nothing_is_written(documents, tmp_path, capsys,
                                                                              kind):
    damage, field = DAMAGE[kind]
    document = json.loads(documents[kind].read_text())
    damage(document)
    bad = tmp_path / f"{kind}.json"
    bad.write_text(json.dumps(document))
    good = [str(p) for k, p in documents.items() if k != kind]
    assert cli.main(["report", *good, str(bad), "--out-dir", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and str(bad) in err[0], err
    assert not (tmp_path / "f").exists()


def test_two_inputs_that_would_write_the_same_figures_are_refused(documents, tmp_path, capsys):
    other = tmp_path / "elsewhere" / "replay.json"
    other.parent.mkdir()
    other.write_text(documents["replay"].read_text())
    assert cli.main(["report", str(documents["replay"]), str(other), "--out-dir", str(tmp_path / "f")]) == 2
    assert "would both write figures named replay-*" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()
