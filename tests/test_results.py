"""The results envelope: every kind validated on write and read, its history, v1 upgraded."""

from __future__ import annotations

import json

import pytest

from convprobe import cli, results
from convprobe.errors import InvalidArgument


def _replay_document(**row_changes):
    row = {"gpu": "V100", "input": "fp16", "output": "fp32", "model": "v100", "k": 4, "vectors": 10,
           "matches": 10, "first_mismatch": None, **row_changes}
    return results.envelope("replay", {"data": "bundled"}, {"seed": None}, results=[row])


def test_history_covers_every_version_and_envelope_is_current():
    assert sorted(results.SCHEMA_HISTORY) == list(range(1, results.SCHEMA_VERSION + 1))
    document = _replay_document()
    assert (document["schema_version"], document["kind"]) == (results.SCHEMA_VERSION, "replay")


def test_write_then_read_round_trips(tmp_path):
    results.write(tmp_path / "r.json", _replay_document())
    assert results.read(tmp_path / "r.json", kinds=("replay",)) == _replay_document()
    with pytest.raises(InvalidArgument, match="holds a 'replay' document; expected 'overflow'"):
        results.read(tmp_path / "r.json", kinds=("overflow",))


@pytest.mark.parametrize("change,message", [
    ({"matches": 11}, r"results\[0\].matches must be at most vectors \(10\); received 11"),
    ({"k": -1}, r"results\[0\].k must be a non-negative integer; received -1"),
    ({"gpu": 3}, r"results\[0\].gpu must be a string; received 3"),
    ({"first_mismatch": []}, r"results\[0\].first_mismatch must be an object or null; received \[\]"),
])
def test_a_malformed_document_is_refused_naming_the_field_and_not_written(tmp_path, change, message):
    with pytest.raises(InvalidArgument, match=message):
        results.write(tmp_path / "r.json", _replay_document(**change))
    assert not (tmp_path / "r.json").exists()


def test_missing_fields_and_unknown_versions_are_named():
    document = _replay_document()
    del document["results"][0]["model"]
    with pytest.raises(InvalidArgument, match=r"results\[0\].model is missing \(it must be a string\)"):
        results.validate(document, where="x")
    with pytest.raises(InvalidArgument, match="schema_version 7 is not one this convprobe reads"):
        results.validate({**_replay_document(), "schema_version": 7}, where="x")
    with pytest.raises(InvalidArgument, match="kind must be one of overflow, compare"):
        results.validate({**_replay_document(), "kind": "bogus"}, where="x")


def test_a_version_1_overflow_document_is_upgraded(tmp_path, capsys):
    assert cli.main(["overflow", "--backend", "emulated", "--accumulate", "fp16", "--format", "json"]) == 0
    current = json.loads(capsys.readouterr().out)
    v1 = {k: v for k, v in current.items() if k != "kind"}
    v1.update(schema_version=1, probe="overflow")  # convprobe 0.1 named the probe, not the kind
    (tmp_path / "old.json").write_text(json.dumps(v1))
    upgraded = results.read(tmp_path / "old.json")
    assert upgraded["kind"] == "overflow" and upgraded["schema_version"] == results.SCHEMA_VERSION
    assert upgraded["results"] == current["results"]
