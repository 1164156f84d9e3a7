"""What `report`, the results reader, the assertions and the pytest plugin read is validated: every
malformed input is one line naming the file, field or argument, what was received and what is
allowed (issue 38, item 6). The CLI exits 2 without a traceback and writes nothing; an assertion
raises InvalidArgument (a ValueError), never a numpy error from deep inside; the plugin stops with
pytest's usage error (exit 4) or a clean collection error."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import main_in_process
from convprobe import cli, results
from convprobe.errors import InvalidArgument
from convprobe.testing import (
    assert_accumulates_in,
    assert_all_finite,
    assert_no_gradient_underflow,
    assert_ulp_close,
    assert_within_error_bound,
    strategies,
)

pytest_plugins = ["pytester"]  # the plugin's cases run a user's test file in a fresh pytest

# -- report and the results reader --------------------------------------------------------

HEADER = {
    "schema_version": 2, "kind": "train", "provenance": {},
    "params": {"dtype": "fp16", "steps": 2, "loss_scale": {"mode": "dynamic", "scale": 1024}},
    "columns": {"steps": ["step", "loss", "loss_scale", "skipped"],
                "telemetry": ["step", "kind", "index", "layer", "flushed_fraction", "subnormal_fraction"]},
    "layers": {"weight": ["conv"], "activation": ["conv"]}, "resumed_at_steps": [], "histogram_bins": [-30, 0],
}
STEPS = "step,loss,loss_scale,skipped\n0,2.5,1024,False\n1,2.0,1024,True\n"
TELEMETRY = ("step,kind,index,layer,flushed_fraction,subnormal_fraction\n"
             "0,weight,0,conv,0.1,0.2\n0,activation,0,conv,0.0,0.1\n")


def _run_dir(path, header=None, steps=STEPS, telemetry=TELEMETRY):
    """A training run's directory as `convprobe train` lays it out: the columns the figures read."""
    path.mkdir()
    (path / "header.json").write_text(json.dumps(HEADER if header is None else header))
    (path / "steps.csv").write_text(steps)
    (path / "telemetry.csv").write_text(telemetry)
    return path


#: Small real documents of the kinds whose fields the cases damage, and a sweep as a CSV table.
COMMANDS = {
    "sweep.json": ["sweep", "--configs", "none", "--model", "sequential:fp16", "--ks", "9,18",
                   "--distributions", "uniform01", "--rows", "4"],
    "sweep.csv": ["sweep", "--configs", "none", "--model", "sequential:fp16", "--ks", "9,18",
                  "--distributions", "uniform01", "--rows", "4"],
    "compare.json": ["compare", "--backend", "emulated", "--batch", "2", "--height", "6", "--width", "6",
                     "--channels", "4", "--filters", "2"],
    "overflow.json": ["overflow", "--backend", "emulated"],
    "identify.json": ["identify", "--configs", "none", "--model", "v100", "--ks", "16", "--op", "conv2d"],
}


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """{file name: its parsed JSON, or a CSV's text}, each written by the command that writes it."""
    out = tmp_path_factory.mktemp("documents")
    found = {}
    for name, argv in COMMANDS.items():
        assert cli.main([*argv, "--output", str(out / name)]) in (0, 1)
        text = (out / name).read_text()
        found[name] = json.loads(text) if name.endswith(".json") else text
    return found


def _cli(argv):
    """cli.main in-process: (exit code, stdout, stderr)."""
    return main_in_process(argv)


def _doc(name, change):
    """A case: the `documents` entry `name` with `change` applied to a copy (a JSON document or a CSV's text)."""
    def make(tmp_path, documents):
        document = copy.deepcopy(documents[name])
        path = tmp_path / name
        if isinstance(document, str):
            path.write_text(change(document))
        else:
            change(document)
            path.write_text(json.dumps(document))
        return path
    return make


def _sweep(change):
    return _doc("sweep.json", change)


def _ulps(document, values):
    label, per_op = next(iter(document["ulp_errors"].items()))
    next(iter(next(iter(per_op.values())).values()))["ulp_errors"] = values


def _text(name, content):
    def make(tmp_path, documents):
        path = tmp_path / name
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        return path
    return make


def _damaged_run(**files):
    """A run directory with some files replaced: text, bytes, a header dict, or a callable(path)."""
    def make(tmp_path, documents):
        run = _run_dir(tmp_path / "run")
        for name, content in files.items():
            target = run / {"header": "header.json", "steps": "steps.csv", "telemetry": "telemetry.csv"}[name]
            if callable(content):
                target.unlink()
                content(target)
            elif isinstance(content, dict):
                target.write_text(json.dumps(content))
            else:
                (target.write_bytes if isinstance(content, bytes) else target.write_text)(content)
        return run
    return make


def _header(**changes):
    header = copy.deepcopy(HEADER)
    for key, value in changes.items():
        *path, last = key.split("__")
        node = header
        for part in path:
            node = node[part]
        node[last] = value
    return header


def _deep(depth):
    return "[" * depth + "]" * depth


def _loop(path):
    os.symlink(path, path)


STEPS_HEAD = "step,loss,loss_scale,skipped\n"
TELEMETRY_HEAD = "step,kind,index,layer,flushed_fraction,subnormal_fraction\n"

#: (id, make(tmp_path, documents) -> the path given to report, what the one line must say).
REPORT_CASES = [
    # the file itself
    ("json nested 100000 deep", _text("deep.json", _deep(100_000)), "is not a readable JSON document (nested too deeply)"),
    ("json objects nested 100000 deep", _text("deep.json", '{"a":' * 100_000 + "1" + "}" * 100_000),
     "is not a readable JSON document (nested too deeply)"),
    ("json a number of 5000 digits", _text("n.json", "1" * 5000), "not a readable JSON document (Exceeds the limit"),
    ("json a string", _text("s.json", '"hello"'), "a convprobe result must be a JSON object; received str"),
    ("json an array", _text("a.json", "[1, 2]"), "a convprobe result must be a JSON object; received list"),
    ("json null", _text("null.json", "null"), "a convprobe result must be a JSON object; received NoneType"),
    ("json empty file", _text("e.json", ""), "is not valid JSON (Expecting value at line 1 column 1)"),
    ("json a key twice", _text("k.json", '{"schema_version": 2, "kind": "sweep", "kind": "train"}'),
     "is not a usable JSON document (it gives the key 'kind' twice in one object; JSON readers differ"),
    ("json binary garbage", _text("b.json", bytes(range(256))), "is not valid JSON (not UTF-8 text: byte 0x80 at offset 128)"),
    ("json truncated", _text("t.json", '{"schema_version": 2, "kind": '), "is not valid JSON (Expecting value"),
    ("json a directory named .json", lambda t, d: (t / "d.json").mkdir() or t / "d.json", "is a directory without a training run"),
    ("json a FIFO", lambda t, d: os.mkfifo(t / "f.json") or t / "f.json", "is not a regular file (a FIFO, socket or device)"),
    ("json a symlink loop", lambda t, d: _loop(t / "l.json") or t / "l.json", "cannot be read (Too many levels of symbolic links)"),
    ("json a broken symlink", lambda t, d: os.symlink(t / "nowhere", t / "b.json") or t / "b.json", "is a broken symbolic link"),
    ("csv empty file", _text("e.csv", ""), "is empty (not even a header line)"),
    ("csv binary garbage", _text("b.csv", bytes(range(256)) * 4), "is not a readable CSV table (Error tokenizing data"),
    ("csv a FIFO", lambda t, d: os.mkfifo(t / "f.csv") or t / "f.csv", "is not a regular file"),
    # the envelope
    ("schema_version true", _sweep(lambda d: d.update(schema_version=True)),
     "schema_version must be an integer, one of the versions 1, 2; received true"),
    ("schema_version 2.0", _sweep(lambda d: d.update(schema_version=2.0)), "must be an integer, one of the versions 1, 2; received 2.0"),
    ("schema_version 1.0", _sweep(lambda d: d.update(schema_version=1.0)), "must be an integer, one of the versions 1, 2; received 1.0"),
    ("schema_version '2'", _sweep(lambda d: d.update(schema_version="2")), "must be an integer, one of the versions 1, 2; received '2'"),
    ("schema_version null", _sweep(lambda d: d.update(schema_version=None)), "received null"),
    ("schema_version nested 400 deep", _text("v.json", '{"schema_version": ' + _deep(400) + "}"),
     "schema_version must be an integer, one of the versions 1, 2; received [[[[[["),
    ("kind a list", _sweep(lambda d: d.update(kind=["sweep"])), 'kind must be a string; received ["sweep"]'),
    ("kind unknown", _sweep(lambda d: d.update(kind="swept")), "kind must be one of overflow, compare,"),
    ("kind nested 400 deep", _text("k.json", '{"schema_version": 2, "kind": ' + _deep(400) + "}"),
     "kind must be a string; received [[[[[["),
    ("params nested 400 deep", _sweep(lambda d: d.update(params=json.loads(_deep(400)))), "params must be an object; received [[["),
    ("sweep NaN ulp errors", _sweep(lambda d: _ulps(d, ["nan", 1.0])),
     ".ulp_errors must be a list of ULP errors, each a number >= 0 or inf (never NaN); received [\"nan\", 1.0]"),
    ("sweep negative ulp errors", _sweep(lambda d: _ulps(d, [-3])), "each a number >= 0 or inf (never NaN); received [-3]"),
    ("sweep a 400-digit ulp error", _sweep(lambda d: _ulps(d, [10**400])), "each a number >= 0 or inf (never NaN); received [1000"),
    ("sweep table k of 400 digits", _sweep(lambda d: d["table"]["rows"][0].update(k=10**400)),
     "table: column k must hold int values (int too large to convert to float)"),
    ("compare fraction_different of 400 digits",
     _doc("compare.json", lambda d: d["results"][0]["observed"].update(fraction_different=10**400)),
     "results[0].observed.fraction_different must be a fraction from 0 to 1; received 1000"),
    ("sweep text ulp errors", _sweep(lambda d: _ulps(d, ["many"])), "received [\"many\"]"),
    ("sweep ulp_errors a list", _sweep(lambda d: d.update(ulp_errors=[])), "ulp_errors must be an object; received []"),
    ("sweep table rows not objects", _sweep(lambda d: d["table"].update(rows=[1])), "table.rows[0] must be an object; received 1"),
    ("sweep table k negative", _sweep(lambda d: d["table"]["rows"][0].update(k=-4)),
     "table: column k must hold values >= 0; row 0 holds -4"),
    ("sweep table k true", _sweep(lambda d: d["table"]["rows"][0].update(k=True)),
     "table: column k must hold int values (true/false is not a number)"),
    ("sweep table fraction 2", _sweep(lambda d: d["table"]["rows"][0].update(fraction_different=2.0)),
     "column fraction_different must hold values from 0 to 1; row 0 holds 2"),
    ("sweep table error text", _sweep(lambda d: d["table"]["rows"][0].update(max_ulp_error="abc")),
     "column max_ulp_error must hold float values (could not convert string to float: 'abc')"),
    ("sweep table cell nested 900 deep", _sweep(lambda d: d["table"]["rows"][0].update(device=json.loads(_deep(900)))),
     "column device must hold str values (a list or an object is not one value)"),
    ("sweep table op an object", _sweep(lambda d: d["table"]["rows"][0].update(op={"name": "conv2d"})),
     "column op must hold str values (a list or an object is not one value)"),
    ("sweep csv k negative", _doc("sweep.csv", lambda t: t.replace(",9,0,", ",-9,0,", 1)),
     "results file sweep.csv: column k must hold values >= 0; row 0 holds -9"),
    ("sweep csv a later row longer than the header", _doc("sweep.csv", lambda t: t.rstrip("\n") + ",extra,fields\n"),
     "sweep.csv' is not a readable CSV table (Error tokenizing data. C error: Expected 36 fields in line 3, saw 38)"),
    ("sweep csv the first row longer than the header",
     _doc("sweep.csv", lambda t: t.replace("\n", ",extra,fields\n", 2).replace(",extra,fields\n", "\n", 1)),
     "sweep.csv' has a row with more fields than its header line"),
    ("sweep csv k a word", _doc("sweep.csv", lambda t: t.replace(",9,0,", ",nine,0,", 1)), "column k must hold int values"),
    ("sweep csv status unknown", _doc("sweep.csv", lambda t: t.replace(",ok,", ",fine,", 1)),
     "status must be one of ok, unsupported"),
    ("overflow outputs not numbers", _doc("overflow.json", lambda d: d["results"][0]["observed"].update(output=["big", "inf"])),
     "results[0].observed.output must be a list of output values as text ('inf', 'nan', '0.0', ...); received [\"big\", \"inf\"]"),
    ("overflow outputs numbers, not text", _doc("overflow.json", lambda d: d["results"][0]["observed"].update(output=[0.0])),
     "results[0].observed.output must be a list of output values as text"),
    ("compare fraction_different 1.5", _doc("compare.json", lambda d: d["results"][0]["observed"].update(fraction_different=1.5)),
     "results[0].observed.fraction_different must be a fraction from 0 to 1; received 1.5"),
    ("compare max_ulp_error a word", _doc("compare.json", lambda d: d["results"][0]["observed"]["real"].update(max_ulp_error="big")),
     "results[0].observed.real.max_ulp_error must be a number; received 'big'"),
    ("compare status unknown", _doc("compare.json", lambda d: d["results"][0].update(status="fine")),
     "results[0].status must be one of ok, unsupported"),
    ("compare results an object", _doc("compare.json", lambda d: d.update(results={})), "results must be a list; received {}"),
    ("identify fraction NaN", _doc("identify.json", lambda d: d["matches"]["emulated/v100"]["conv2d"]["summary"]["fractions"].update({"16": "nan"})),
     "matches['emulated/v100']['conv2d'].summary.fractions['16'] must be a fraction from 0 to 1; received 'nan'"),
    ("identify fraction 2", _doc("identify.json", lambda d: d["matches"]["emulated/v100"]["conv2d"]["summary"]["fractions"].update({"16": 2})),
     "must be a fraction from 0 to 1; received 2"),
    ("identify fractions keyed by words", _doc("identify.json", lambda d: d["matches"]["emulated/v100"]["conv2d"]["summary"]["fractions"].update({"k16": 1.0})),
     "summary.fractions must be keyed by reduction lengths K; received 'k16'"),
    ("identify matches a list", _doc("identify.json", lambda d: d.update(matches=[])), "matches must be an object; received []"),
    ("bare table rows not objects", _text("t.json", '{"schema": "sweep", "rows": [1, 2]}'), "'rows' must be a list of objects"),
    ("bare table schema a list", _text("t.json", '{"schema": ["sweep"], "rows": []}'),
     'schema must be one of sweep, probe; received ["sweep"]'),
    # a training run
    ("run: steps.csv a directory", _damaged_run(steps=lambda p: p.mkdir()), "steps.csv is a directory, not a file"),
    ("run: telemetry.csv a directory", _damaged_run(telemetry=lambda p: p.mkdir()), "telemetry.csv is a directory, not a file"),
    ("run: header.json a directory", _damaged_run(header=lambda p: p.mkdir()), "header.json' is a directory, not a file"),
    ("run: header.json a symlink loop", _damaged_run(header=_loop), "header.json' cannot be read (Too many levels of symbolic links)"),
    ("run: steps.csv a symlink loop", _damaged_run(steps=_loop), "steps.csv cannot be read (Too many levels of symbolic links)"),
    ("run: steps.csv a FIFO", _damaged_run(steps=os.mkfifo), "steps.csv is not a regular file (a FIFO, socket or device)"),
    ("run: steps.csv missing", _damaged_run(steps=lambda p: None), "steps.csv does not exist"),
    ("run: steps.csv empty", _damaged_run(steps=""), "steps.csv is empty (not even a header line)"),
    ("run: steps.csv binary garbage", _damaged_run(steps=bytes(range(256)) * 4), "steps.csv is not a readable CSV table"),
    ("run: steps.csv a row longer than the header", _damaged_run(steps=STEPS_HEAD + "0,1.0,2,False,9,9\n"),
     "steps.csv has a row with more fields than its header line"),
    ("run: steps.csv a missing column", _damaged_run(steps="step,loss,skipped\n0,1.0,False\n"), "steps.csv has columns"),
    ("run: loss a word", _damaged_run(steps=STEPS_HEAD + "0,2.0,2,False\n1,abc,2,False\n"),
     "steps.csv: column 'loss' must hold numbers (nan and inf included); row 1 holds 'abc'"),
    ("run: loss_scale NaN", _damaged_run(steps=STEPS_HEAD + "0,1.0,nan,False\n"),
     "column 'loss_scale' must hold positive finite numbers; row 0 holds NaN"),
    ("run: loss_scale 0", _damaged_run(steps=STEPS_HEAD + "0,1.0,0,False\n"), "column 'loss_scale' must hold positive finite numbers"),
    ("run: loss_scale true", _damaged_run(steps=STEPS_HEAD + "0,1.0,True,False\n"), "row 0 holds true"),
    ("run: step 1.5", _damaged_run(steps=STEPS_HEAD + "1.5,1.0,2,False\n"), "column 'step' must hold non-negative integers; row 0 holds 1.5"),
    ("run: step -1", _damaged_run(steps=STEPS_HEAD + "-1,1.0,2,False\n"), "column 'step' must hold non-negative integers; row 0 holds -1"),
    ("run: step of 400 digits", _damaged_run(steps=STEPS_HEAD + "9" * 400 + ",1.0,2,False\n"), "column 'step' must hold non-negative integers"),
    ("run: step empty", _damaged_run(steps=STEPS_HEAD + ",1.0,2,False\n"), "column 'step' must hold non-negative integers; row 0 holds NaN"),
    ("run: skipped 'maybe'", _damaged_run(steps=STEPS_HEAD + "0,1.0,2,maybe\n"), "column 'skipped' must hold True or False; row 0 holds 'maybe'"),
    ("run: telemetry negative fraction", _damaged_run(telemetry=TELEMETRY_HEAD + "0,weight,0,conv,-0.1,0.2\n"),
     "telemetry.csv: column 'flushed_fraction' must hold fractions from 0 to 1; row 0 holds -0.1"),
    ("run: telemetry fraction above 1", _damaged_run(telemetry=TELEMETRY_HEAD + "0,weight,0,conv,0.1,1.5\n"),
     "column 'subnormal_fraction' must hold fractions from 0 to 1; row 0 holds 1.5"),
    ("run: telemetry fraction NaN", _damaged_run(telemetry=TELEMETRY_HEAD + "0,weight,0,conv,nan,0.5\n"), "row 0 holds NaN"),
    ("run: telemetry kind unknown", _damaged_run(telemetry=TELEMETRY_HEAD + "0,bias,0,conv,0.1,0.5\n"),
     "column 'kind' must hold weight or activation; row 0 holds 'bias'"),
    ("run: telemetry index negative", _damaged_run(telemetry=TELEMETRY_HEAD + "0,weight,-2,conv,0.1,0.5\n"),
     "column 'index' must hold non-negative integers; row 0 holds -2"),
    ("run: telemetry.csv with a BOM and a word", _damaged_run(telemetry="\ufeff" + TELEMETRY_HEAD + "x,weight,0,conv,0.1,0.5\n"),
     "column 'step' must hold non-negative integers; row 0 holds 'x'"),
    ("run: header schema_version true", _damaged_run(header=_header(schema_version=True)), "received true"),
    ("run: header an array", _damaged_run(header="[]"), "a convprobe result must be a JSON object; received list"),
    ("run: header dtype unknown", _damaged_run(header=_header(params__dtype="fp99")),
     "params.dtype must be one of fp16, bf16, fp32; received 'fp99'"),
    ("run: header loss-scale mode unknown", _damaged_run(header=_header(params__loss_scale__mode="auto")),
     "params.loss_scale.mode must be one of none, static, static-no-skip, dynamic; received 'auto'"),
    ("run: header dtype a number", _damaged_run(header=_header(params__dtype=16)), "params.dtype must be a string; received 16"),
    ("run: header nested 100000 deep", _damaged_run(header=_deep(100_000)), "is not a readable JSON document (nested too deeply)"),
    ("run in a comparison folder: header.json a directory",
     lambda t, d: (t / "cmp" / "a" / "header.json").mkdir(parents=True) or t / "cmp", "header.json' is a directory, not a file"),
]


@pytest.mark.parametrize("make,message", [c[1:] for c in REPORT_CASES], ids=[c[0] for c in REPORT_CASES])
def test_report_refuses_a_malformed_input_in_one_line(tmp_path, documents, make, message):
    path = make(tmp_path, documents)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _cli(["report", str(path), "--out-dir", str(tmp_path / "figures"), "--formats", "png"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("convprobe report: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in err and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_the_inputs_the_cases_damage_are_drawn(tmp_path, documents):
    """The cases above damage inputs that are otherwise drawable: this is what they start from."""
    paths = [_run_dir(tmp_path / "run")]
    for name, document in documents.items():
        paths.append(tmp_path / name.replace(".", "-") / name)
        paths[-1].parent.mkdir()
        paths[-1].write_text(document if isinstance(document, str) else json.dumps(document))
    bom = tmp_path / "bom" / "sweep.json"  # a UTF-8 byte order mark is allowed
    bom.parent.mkdir()
    bom.write_text("\ufeff" + json.dumps(documents["sweep.json"]), encoding="utf-8")
    for path in (*paths, bom):
        code, out, err = _cli(["report", str(path), "--out-dir", str(tmp_path / f"f-{path.parent.name}"),
                               "--formats", "png"])
        assert code == 0 and out and err == "", err


@pytest.mark.parametrize("argv,message", [
    (["report", ""], "argument RESULTS: received an empty value; it takes RESULTS"),
    (["report", "a\x00b.json"], "results file 'a\\x00b.json' cannot be read (embedded null byte)"),
    (["report", "x" * 300 + ".json"], "cannot be read (File name too long)"),
    (["report", "{tmp}/sweep.json", "--out-dir", "{tmp}/" + "y" * 300], "has a name of 300 bytes; at most 255 are allowed"),
], ids=["empty path", "NUL byte", "name too long", "out-dir name too long"])
def test_report_refuses_paths_the_os_cannot_take(tmp_path, documents, argv, message):
    (tmp_path / "sweep.json").write_text(json.dumps(documents["sweep.json"]))
    code, out, err = _cli([a.replace("{tmp}", str(tmp_path)) for a in argv])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0] and out == "", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]


@pytest.mark.parametrize("depth", [900, 990, 100_000])
def test_report_in_a_fresh_process_refuses_deep_nesting_without_a_traceback(tmp_path, depth):
    """The stack a fresh `convprobe` starts with, not pytest's: what a user's shell sees. Near the
    parser's limit either the parser or the validator speaks, never a traceback."""
    (tmp_path / "deep.json").write_text('{"schema_version": 2, "kind": "sweep", "params": ' + _deep(depth) + "}")
    run = subprocess.run([sys.executable, "-m", "convprobe", "report", str(tmp_path / "deep.json"), "--out-dir",
                          str(tmp_path / "figures")], capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert ("params must be an object; received [[[" in lines[0]
            or "is not a readable JSON document (nested too deeply)" in lines[0]), lines[0]
    assert not (tmp_path / "figures").exists()


@pytest.mark.parametrize("document,message", [
    ({"schema_version": True, "kind": "replay", "params": {}, "provenance": {}, "results": []},
     "schema_version must be an integer, one of the versions 1, 2; received true"),
    ({"schema_version": True, "probe": "overflow", "params": {}, "provenance": {}, "results": []},
     "received true"),  # true == 1 in Python: it must not be upgraded as a version-1 document
    ({"schema_version": 1.0, "config": {}, "columns": {}}, "received 1.0"),
])
def test_read_refuses_versions_that_only_compare_equal(tmp_path, document, message):
    (tmp_path / "r.json").write_text(json.dumps(document))
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        results.read(tmp_path / "r.json")


def test_show_quotes_values_that_are_too_deep_or_not_json():
    assert results.show("x") == "'x'"
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert results.show(deep).startswith("[[[[[[")
    assert results.show({1, 2}) == "{1, 2}"


# -- the assertions -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def telemetry_dir(tmp_path_factory):
    """Telemetry files of every kind of damage (and a run without one, and a directory in its place)."""
    tmp = tmp_path_factory.mktemp("telemetry")
    (tmp / "run").mkdir()
    (tmp / "dir" / "telemetry.csv").mkdir(parents=True)
    (tmp / "empty.csv").write_text("")
    (tmp / "binary.csv").write_bytes(bytes(range(256)) * 4)
    for name, row in {"neg": "a,-5,1,0", "word": "a,x,1,0", "over": "a,5,9,0", "frac": "a,5,1.5,0"}.items():
        (tmp / f"{name}.csv").write_text(f"layer,n,flushed,lost\n{row}\n")
    return tmp


GOOD_TELEMETRY = [{"layer": "a", "n": 10, "flushed": 0, "lost": 0, "kind": "weight"}]
ONE = [1.0]

#: (call(telemetry_dir), what the one line must say): every call is a wrong question.
ASSERTION_CASES = [
    (lambda t: assert_all_finite("abc"), "array must be an array of real numbers; received str 'abc'"),
    (lambda t: assert_all_finite(None), "array must be an array of real numbers; received NoneType None"),
    (lambda t: assert_all_finite(["a", "b"]), "received dtype <U1"),
    (lambda t: assert_all_finite({"a": 1.0}), "received dict {'a': 1.0}"),
    (lambda t: assert_all_finite(np.array([1.0, None], dtype=object)), "received dtype object (None, text, or"),
    (lambda t: assert_all_finite([10**400]), "received dtype object"),
    (lambda t: assert_all_finite([[1.0, 2.0], [3.0]]), "received a ragged list (its rows differ in length"),
    (lambda t: assert_all_finite(np.array([1j, complex(np.inf, 0)])), "received dtype complex128"),
    (lambda t: assert_all_finite(np.array(["2020-01-01"], dtype="datetime64[D]")), "received dtype datetime64[D]"),
    (lambda t: assert_all_finite(b"\x00\x01"), "received bytes"),
    (lambda t: assert_all_finite("abc", name="conv out"), "conv out must be an array of real numbers"),
    (lambda t: assert_all_finite(ONE, name=3), "name must be a string; received int 3"),
    (lambda t: assert_ulp_close("a", "b", 0, "fp16"), "actual must be an array of real numbers; received str 'a'"),
    (lambda t: assert_ulp_close(ONE, None, 0, "fp16"), "expected must be an array of real numbers; received NoneType"),
    (lambda t: assert_ulp_close(["1.0"], ["1.0"], 0), "actual must be an array of real numbers; received dtype <U3"),
    (lambda t: assert_ulp_close(ONE, [ONE, [ONE]], 0, "fp16"), "expected must be an array of real numbers; received a ragged"),
    (lambda t: assert_within_error_bound("abc", ONE, K=4), "actual must be an array of real numbers; received str"),
    (lambda t: assert_within_error_bound(ONE, None, K=4), "reference must be an array of real numbers; received NoneType"),
    (lambda t: assert_within_error_bound(ONE, ONE, K=4, abs_sum="x"), "abs_sum must be an array of real numbers"),
    (lambda t: assert_within_error_bound(ONE, ONE, K=4, abs_sum=[np.nan]), "abs_sum must hold non-negative numbers, never NaN"),
    (lambda t: assert_within_error_bound(ONE, ONE, K=4, abs_sum=[-1.0]), "abs_sum must hold non-negative numbers"),
    (lambda t: assert_within_error_bound([1.0, 2.0], [1.0, 2.0], K=4, abs_sum=[1.0, 2.0, 3.0]),
     "abs_sum must broadcast to the shape of actual and reference (2,); received shape (3,)"),
    (lambda t: assert_within_error_bound(ONE, ONE, K=4, kind="probabilistic", lam="x"), "lam must be a positive number; received str 'x'"),
    (lambda t: assert_within_error_bound(ONE, ONE, K=4, kind="probabilistic", lam=True), "lam must be a positive number; received bool"),
    (lambda t: assert_within_error_bound(ONE, ONE, K=4, kind="probabilistic", lam=float("inf")), "lam must be a positive number"),
    (lambda t: assert_no_gradient_underflow(str(t / "nowhere")), "nowhere' does not exist"),
    (lambda t: assert_no_gradient_underflow(t / "run"), "telemetry.csv' does not exist"),
    (lambda t: assert_no_gradient_underflow(t / "dir"), "telemetry.csv' is a directory, not a file"),
    (lambda t: assert_no_gradient_underflow(t / "empty.csv"), "empty.csv' is empty (not even a header line)"),
    (lambda t: assert_no_gradient_underflow(t / "binary.csv"), "binary.csv' is not a readable CSV table"),
    (lambda t: assert_no_gradient_underflow(t / "neg.csv"), "records: column 'n' must hold non-negative integers; row 0 holds -5"),
    (lambda t: assert_no_gradient_underflow(t / "word.csv"), "column 'n' must hold non-negative integers; row 0 holds 'x'"),
    (lambda t: assert_no_gradient_underflow(t / "frac.csv"), "column 'flushed' must hold non-negative integers; row 0 holds 1.5"),
    (lambda t: assert_no_gradient_underflow(t / "over.csv"), "columns flushed + lost must be at most n (values counted); row 0 holds flushed + lost 9 of n 5"),
    (lambda t: assert_no_gradient_underflow([{**GOOD_TELEMETRY[0], "step": "x"}]), "column 'step' must hold non-negative integers; row 0 holds 'x'"),
    (lambda t: assert_no_gradient_underflow([{**GOOD_TELEMETRY[0], "loss_scale": 0}]), "column 'loss_scale' must hold positive finite numbers"),
    (lambda t: assert_no_gradient_underflow([{**GOOD_TELEMETRY[0], "n": True}]), "column 'n' must hold non-negative integers; row 0 holds true"),
    (lambda t: assert_no_gradient_underflow(None), "records must be a DataFrame, a list of dicts, a telemetry.csv path or a run directory; received NoneType"),
    (lambda t: assert_no_gradient_underflow({"layer": ["a"], "n": [1], "flushed": [0]}), "; received dict {"),
    (lambda t: assert_no_gradient_underflow([1, 2]), "; records[0] is int 1"),
    (lambda t: assert_no_gradient_underflow(GOOD_TELEMETRY, layer=3), "layer must be a layer name or glob, or a list of them; received int 3"),
    (lambda t: assert_no_gradient_underflow(GOOD_TELEMETRY, layer=["a", 3]), "received list ['a', 3]"),
    (lambda t: assert_no_gradient_underflow(GOOD_TELEMETRY, kind=["weight"]), "kind must be 'weight' or 'activation'; received list"),
    (lambda t: assert_accumulates_in("sequential:fp32", "fp32", compare_params=3),
     "compare_params must be a dict of the compare probe's parameters; received int 3"),
    (lambda t: assert_accumulates_in("sequential:fp32", "fp32", compare_params={"batches": 2}),
     "compare_params key must be one of seed, batch, height, width, channels, filters, kernel; received 'batches'"),
    (lambda t: assert_accumulates_in("sequential:fp32", "fp32", compare_params={"batch": 0}),
     "compare_params['batch'] must be an integer >= 1; received int 0"),
    (lambda t: assert_accumulates_in("sequential:fp32", "fp32", compare_params={"seed": 1.5}),
     "compare_params['seed'] must be an integer >= 0; received float 1.5"),
    (lambda t: assert_accumulates_in("sequential:fp32", "fp32", timeout=-1), "timeout must be a positive number of seconds; received int -1"),
    (lambda t: assert_accumulates_in("sequential:fp32", "fp32", timeout="60"), "received str '60'"),
    (lambda t: assert_accumulates_in(None, "fp32"), "backend must be a BackendConfig"),
]


@pytest.mark.parametrize("call,message", ASSERTION_CASES, ids=[m[:70] for _, m in ASSERTION_CASES])
def test_an_assertion_given_a_wrong_argument_says_so_in_one_line(telemetry_dir, call, message):
    """A wrong question is an InvalidArgument (a ValueError), not a failed claim (AssertionError)
    and not an error from inside numpy or pandas."""
    with np.errstate(all="ignore"), pytest.raises(InvalidArgument) as info:
        call(telemetry_dir)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


# -- the pytest plugin ----------------------------------------------------------------------

USES_RNG = """
def test_draws(rng):
    rng.integers(0, 10)
"""

#: (arguments, ini lines, the usage error pytest must print): nothing runs, exit 4.
PLUGIN_USAGE_CASES = [
    (["--convprobe-seed=-1"], "", "--convprobe-seed must be an integer from 0 to 2**63 - 1; received '-1'"),
    (["--convprobe-seed=abc"], "", "--convprobe-seed must be an integer from 0 to 2**63 - 1; received 'abc'"),
    (["--convprobe-seed=1.5"], "", "received '1.5'"),
    (["--convprobe-seed=9223372036854775808"], "", "received '9223372036854775808'"),
    ([], "convprobe_seed = -5", "ini value convprobe_seed must be an integer from 0 to 2**63 - 1; received '-5'"),
    ([], "convprobe_seed = seven", "ini value convprobe_seed must be an integer from 0 to 2**63 - 1; received 'seven'"),
    ([], "convprobe_seed = 0x10", "received '0x10'"),
    ([], "convprobe_backends = tensorflw", "ini value convprobe_backends must be one of emulated, tensorflow, jax, torch, all; received 'tensorflw'"),
    (["--convprobe-backends=gpu"], "", "argument --convprobe-backends: invalid choice: 'gpu'"),
]


@pytest.mark.parametrize("args,ini,message", PLUGIN_USAGE_CASES, ids=[" ".join(c[0]) or c[1] for c in PLUGIN_USAGE_CASES])
def test_a_bad_plugin_option_or_ini_value_is_pytests_usage_error(pytester, args, ini, message):
    pytester.makepyfile(test_user=USES_RNG)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert message in err and "Traceback" not in err + result.stdout.str(), err
    assert "passed" not in result.stdout.str()


def test_good_seeds_from_the_option_and_the_ini_run(pytester):
    pytester.makepyfile(test_user=USES_RNG)
    pytester.makeini("[pytest]\nconvprobe_seed = 9223372036854775807\nconvprobe_backends = all\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--convprobe-seed", "0")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["convprobe: rng base seed 0; conv_backend over all configurations"])


#: (a test's marker line, the one collection error line that must name it).
MARKER_CASES = [
    ('@pytest.mark.conv_backends("tensorflw/cpu/fp16")',
     "In test_user.py::test_marked: conv_backends argument 1: backend must be *; received 'tensorflw/cpu/fp16' (*"),
    ('@pytest.mark.conv_backends("sequential:fp16", "serial:fp16")',
     "In test_user.py::test_marked: conv_backends argument 2: backend must be *received 'serial:fp16'*"),
    ("@pytest.mark.conv_backends(3)", "In test_user.py::test_marked: conv_backends argument 1: backend must be *received int 3"),
    ('@pytest.mark.conv_backends(["sequential:fp16"])', "*conv_backends argument 1: backend must be *received list*"),
    ("@pytest.mark.conv_backends(None)", "*conv_backends argument 1: backend must be *received NoneType None"),
    ('@pytest.mark.conv_backends("tensorflow/cpu/fp8")',
     "*conv_backends argument 1: accumulate in 'tensorflow/cpu/fp8' must be one of fp16, fp32, default or *"),
    ('@pytest.mark.conv_backends("tensorflow/tpu")', "*conv_backends argument 1: device must be one of cpu, gpu, auto; received 'tpu'"),
    ('@pytest.mark.conv_backends(backends=["sequential:fp16"])',
     "In test_user.py::test_marked: conv_backends takes the backends as positional arguments; received the keyword(s) backends"),
    ("@pytest.mark.conv_backends()", "In test_user.py::test_marked: conv_backends needs at least one backend*"),
    ('@pytest.mark.conv_backend("sequential:fp16")',
     "In test_user.py::test_marked: unknown marker 'conv_backend'; did you mean 'conv_backends' (convprobe)?"),
    ('@pytest.mark.convbackends("sequential:fp16")', "*unknown marker 'convbackends'; did you mean 'conv_backends'*"),
    ("@pytest.mark.gpus", "In test_user.py::test_marked: unknown marker 'gpus'; did you mean 'gpu' (convprobe)?"),
    ("@pytest.mark.tensorflw", "*unknown marker 'tensorflw'; did you mean 'tensorflow'*"),
]


@pytest.mark.parametrize("marker,line", MARKER_CASES, ids=[c[0] for c in MARKER_CASES])
def test_a_bad_or_misspelt_marker_is_a_collection_error_naming_it(pytester, marker, line):
    pytester.makepyfile(test_user=f"import pytest\n\n{marker}\ndef test_marked(conv_backend):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # pytest's "errors during collection"
    result.stdout.fnmatch_lines(["*ERROR collecting test_user.py*", line])
    out = result.stdout.str()
    assert "Traceback" not in out and "During handling" not in out and "passed" not in out, out


def test_strict_markers_still_names_a_misspelt_marker(pytester):
    pytester.makepyfile(test_user='import pytest\n\n@pytest.mark.conv_backend("sequential:fp16")\n'
                                  "def test_marked(conv_backend):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*'conv_backend' not found in `markers` configuration option*"])


# -- the hypothesis strategies --------------------------------------------------------------


@pytest.mark.parametrize("call,message", [
    (lambda s: s.fp16_arrays("x"), "shape must be a non-negative integer, a tuple of them or a strategy of shapes; received 'x'"),
    (lambda s: s.fp16_arrays(-1), "received -1"),
    (lambda s: s.fp16_arrays(None), "received None"),
    (lambda s: s.fp16_arrays(3.5), "received 3.5"),
    (lambda s: s.fp16_arrays((2, -1)), "received (2, -1)"),
    (lambda s: s.fp16_arrays(3, min_value="a"), "min_value must be a number or None; received 'a'"),
    (lambda s: s.fp16_arrays(3, max_value=float("nan")), "max_value must be a number or None; received nan"),
    (lambda s: s.representable_floats(min_value=True), "min_value must be a number or None; received True"),
    (lambda s: s.fp16_arrays(3, allow_nan="no"), "allow_nan must be True or False; received 'no'"),
    (lambda s: s.bf16_arrays(3, unique=1), "unique must be True or False; received 1"),
    (lambda s: s.fp16_arrays(3, min_value=1e10), "no finite fp16 value lies in [10000000000.0, None] (its largest is 65504.0)"),
    (lambda s: s.representable_floats("fp16", min_value=2, max_value=1), "min_value must be <= max_value; received 2.0 > 1.0"),
])
def test_a_strategy_given_a_wrong_argument_says_so_when_built(call, message):
    """When the strategy is built, in convprobe's words: not hypothesis's own error at the first draw."""
    with pytest.raises(InvalidArgument) as info:
        call(strategies)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
