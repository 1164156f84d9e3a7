"""Bad input, CLI and API: one clear line naming what was wrong and what is allowed, exit 2,
no traceback, nothing written, and (for the CLI) before any work starts."""

import os
import zipfile

import numpy as np
import pytest

from conftest import main_in_process, run_cli
from convprobe.errors import InvalidArgument


def _run(argv, tmp_path):
    """cli.main in-process: (exit code, stdout, stderr)."""
    return main_in_process(argv)


EMU = ["--configs", "none", "--model", "v100"]
CLI_CASES = [
    # options with closed sets and ranges
    (["overflow", "--accumulate", "fp8"], "invalid choice: 'fp8'"),
    (["overflow", "--backend", "cuda"], "invalid choice: 'cuda'"),
    (["overflow", "--format", "xml"], "invalid choice: 'xml'"),
    (["overflow", "--timeout", "1e23"], "--timeout: must be an integer from 1 to 604800"),
    (["overflow", "--timeout", "0"], "--timeout: must be an integer from 1 to 604800"),
    (["overflow", "--jobs", "0"], "--jobs: must be an integer from 1 to 256"),
    (["overflow", "--seed", "-1"], "--seed: must be an integer from 0 to 2**63 - 1"),
    (["overflow", "--env", "FOO"], "env must be NAME=VALUE"),
    (["overflow", "--backend", "tensorflow", "--model", "v100"], "model applies only to --backend emulated"),
    (["overflow", "--backend", "emulated", "--model", "serial:fp16"], "model must be one of sequential"),
    (["overflow", "--backend", "emulated", "--model", "blocked:fp16:b=0"], "b must be an integer >= 1"),
    (["overflow", "--backend", "emulated", "--model", "a100:in=int8"], "in must be one of fp16, bf16"),
    (["overflow", "--backend", "emulated", "--model", "splitk(2, a100"], "splitk spec must end with ')'"),
    (["overflow", "--backend", "emulated", "--model", "lanes(4, v100)"], "lanes needs combine=MODEL"),
    (["overflow", "--expect", "fp64"], "invalid choice: 'fp64'"),
    (["compare", "--batch", "0"], "--batch: must be an integer from 1 to 4096"),
    (["compare", "--kernel", "40", "--height", "8", "--width", "8"], "kernel must be at most height and width"),
    (["compare", "--batch", "4096", "--height", "4096", "--width", "4096"], "GiB (half this machine's memory)"),
    (["compare", "--channels", "100000"], "--channels: must be an integer from 1 to 8192"),
    # outputs, checked before any work
    (["overflow", "--output", "/proc/x.json"], "cannot be written: '/proc' is not a writable directory"),
    (["overflow", "--format", "csv", "--output", "{tmp}/o.json"], "ends in .json but the output format is csv"),
    (["overflow", "--output", "{tmp}"], "--output must be a file path"),
    (["overflow", "--output", "{tmp}/file/o.json"], "its parent"),
    (["fingerprint", *EMU, "--output", "{tmp}/x.txt"], "--output must end in .json or .csv"),
    (["identify", *EMU, "--output", "{tmp}/x.png"], "--output must end in .json or .csv"),
    (["sweep", *EMU, "--output", "/proc/s.csv"], "cannot be written"),
    (["report", "{tmp}/missing.json", "--out-dir", "{tmp}/file"], "is a file; it must be a directory"),
    (["report", "{tmp}/missing.json", "--output", "{tmp}/file"], "--output '"),
    (["replay", "--output", "{tmp}/r.csv"], "ends in .csv but the output format is json"),
    # study commands
    (["fingerprint", "--op", "warp", *EMU], "op must be one of conv2d"),
    (["fingerprint", "--configs", "nosuch"], "configuration must be one of default"),
    (["fingerprint", "--configs", "none"], "nothing to run: --configs none and no --model"),
    (["identify", "--candidates", ",", *EMU], "--candidates must name at least one model spec"),
    (["identify", "--candidates", "sequentail:fp16", *EMU], "model must be one of"),
    (["identify", "--ks", "0", *EMU], "--ks: must be comma-separated integers from 1 to 65536"),
    (["identify", "--ks", "100000", *EMU], "--ks: must be comma-separated integers from 1 to 65536"),
    (["identify", "--ks", "16,x", *EMU], "--ks: must be comma-separated integers"),
    (["identify", "--rows", "100000", *EMU], "--rows: must be an integer from 1 to 4096"),
    (["identify", *EMU, "--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8", "--trees", "never"],
     "invalid choice: 'never'"),
    (["identify", *EMU, "--trees", "always"], "--trees applies to layer mode"),
    # layer mode: every shape and mode conflict before anything runs
    (["identify", *EMU, "--input-shape", "1,8,8"], "--input-shape and --filter-shape go together"),
    (["identify", *EMU, "--input-shape", "1,8,8", "--filter-shape", "3,3,16,8"],
     "--input-shape must be 4 comma-separated positive integers; received '1,8,8'"),
    (["identify", *EMU, "--input-shape", "1,8,8,16", "--filter-shape", "3,3,32,8"],
     "filter-shape input channels (32) must equal input-shape channels (16)"),
    (["identify", *EMU, *["--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8"], "--padding", "FULL"], "padding must be one of SAME, VALID; received 'FULL'"),
    (["identify", *EMU, *["--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8"], "--strides", "0"], "--strides must be one or two comma-separated positive"),
    (["identify", *EMU, "--input-shape", "1,2,2,16", "--filter-shape", "3,3,16,8", "--padding", "VALID"],
     "input 2x2 is too small for a 3x3 filter"),
    (["identify", *EMU, "--input-shape", "4096,512,512,16", "--filter-shape", "3,3,16,8"],
     "elements; at most 16777216 are allowed"),
    (["identify", *EMU, *["--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8"], "--ks", "16"], "--ks applies to the battery"),
    (["identify", *EMU, *["--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8"], "--op", "matmul"], "--op applies to the battery"),
    (["identify", *EMU, *["--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8"], "--batch", "8"], "put N in --input-shape"),
    (["identify", *EMU, *["--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8"], "--resnet-size", "20"], "choose one of --input-shape/--filter-shape, --keras-model"),
    (["identify", *EMU, "--resnet-size", "21"], "--resnet-size must be 6n+2"),
    (["identify", *EMU, "--resnet-size", "20", "--strides", "2"], "a model's layers carry their own"),
    (["identify", *EMU, "--keras-model", "{tmp}/missing.keras"], "does not exist"),
    (["identify", *EMU, "--keras-model", "{tmp}/file"], "must end in .keras, .h5, .hdf5 (what Keras saves"),
    (["identify", *EMU, "--threads", "0"], "--threads: must be an integer from 1 to 1024"),
    (["identify", *EMU, "--batch", "2"], "--batch applies to --keras-model and --resnet-size only"),
    (["identify", *EMU, "--image-size", "64"], "--image-size applies to --resnet-size only"),
    (["identify", *EMU, "--strides", "2"], "apply to --input-shape/--filter-shape"),
    (["identify", *EMU, "--input-shape", "1,8,8,16", "--filter-shape", "3,3,16,8", "--strides", "2",
      "--dilation", "2"], "takes strides > 1 or dilation > 1, not both"),
    (["sweep", "--distributions", "gauss", *EMU], "distribution must be one of uniform01"),
    (["sweep", "--bound-format", "fp12", *EMU], "bound-format must be one of"),
    (["sweep", "--rows", "0", *EMU], "--rows: must be an integer from 1 to 4096"),
    (["report", "{tmp}/missing.json"], "does not exist"),
    (["report", "--formats", "gif", "{tmp}/missing.json"], "formats must be one of png, svg"),
    (["report", "--formats", ",", "{tmp}/missing.json"], "formats must name at least one of png, svg"),
    # replay
    (["replay", "--data", "{tmp}/nowhere"], "--data must be a directory"),
    (["replay", "--gpu", ","], "--gpu must name at least one GPU"),
    (["replay", "--gpu", "t4"], "no bundled vector sets for --gpu t4"),
    (["replay", "--gpu", "v100,t4x"], "--gpu 't4x' matches no GPU folder or preset of this data"),
    (["overflow", "--output", "{tmp}/newdir/"], "--output must be a file path"),
    # train
    (["train", "--steps", "0"], "--steps must be an integer from 1 to"),
    (["train", "--batch-size", "100000000"], "--batch-size must be an integer from 1 to 65536"),
    (["train", "--batch-size", "60000", "--image-size", "1024"], "GiB (half this machine's memory)"),
    (["train", "--image-size", "5000"], "--image-size must be an integer from 1 to 1024"),
    (["train", "--dtype", "fp8"], "--dtype must be one of fp16, bf16, fp32"),
    (["train", "--loss-scale", "-3"], "--loss-scale must be none, dynamic or a positive number"),
    (["train", "--resnet-size", "21"], "--resnet-size must be 6n+2"),
    (["train", "--record-every", "0"], "--record-every must be an integer from 1 to"),
    (["train", "--learning-rate", "nan"], "--learning-rate must be a positive number"),
    (["train", "--distribute", "tpu"], "--distribute must be one of none, mirrored, multi-worker"),
    (["train", "--output", "/proc/run"], "cannot be written"),
    (["train", "--output", "{tmp}/file"], "is a file; it must be a run directory"),
    (["train", "--data", "cifar10"], "--data-dir must name a directory"),
    (["train", "--arithmetic", "fp9"], "--arithmetic must be native, twin, or a model spec or GPU preset"),
    (["train", "--arithmetic", "a100", "--jit"], "computes the convolutions in the emulator, which XLA cannot compile"),
    (["train", "--arithmetic", "a100", "--config", "jit+strict"], "received --config jit+strict"),
    (["train", "--arithmetic", "a100", "--dtype", "bf16"], "it applies to --dtype fp16; received --dtype bf16"),
    (["train", "--arithmetic-map", "{tmp}/map.json"], "--arithmetic-map is read only with --arithmetic twin"),
    (["train", "--arithmetic", "twin", "--arithmetic-map", "{tmp}/map.json"], "--arithmetic-map: "),
    (["train", "--config", "nope"], "--config must be one of default, onednn-off,"),
    (["train", "--arm", "fp32", "--devices", "4"], "--devices applies to --distribute mirrored"),
    (["train", "--config", "jit", "--no-jit"], "--config jit runs with XLA; received --no-jit"),
    (["train", "--distribute", "multi-worker", "--output", "{tmp}/run"],
     "--distribute multi-worker needs TF_CONFIG in the environment"),
    (["train", "--local-workers", "2", "--output", "{tmp}/run"], "--local-workers needs --distribute multi-worker"),
    (["train", "--distribute", "multi-worker", "--local-workers", "1", "--output", "{tmp}/run"],
     "--local-workers must be an integer from 2"),
    (["train", "--distribute", "multi-worker", "--local-workers", "3", "--batch-size", "16", "--output", "{tmp}/run"],
     "--batch-size must be a multiple of --local-workers (3)"),
    (["train", "--distribute", "multi-worker", "--local-workers", "2", "--compare-loss-scaling",
      "--output", "{tmp}/run"], "--compare-loss-scaling runs in one process"),
    (["train", "--distribute", "multi-worker", "--local", "2", "--output", "{tmp}/run"],
     "unrecognized arguments: --local 2"),
    # an empty value is refused, never taken as 'not given'
    (["identify", "--keras-model", ""], "argument --keras-model: received an empty value; it takes PATH"),
    (["train", "--arithmetic", ""], "argument --arithmetic: received an empty value"),
    (["train", "--arithmetic-map", " "], "argument --arithmetic-map: received an empty value; it takes FILE"),
    (["overflow", "--accumulate", ""], "--accumulate: received an empty value; it takes one of fp16, fp32, default, all"),
    (["train", "--arm", "fp32", "--arm", ""], "argument --arm: received an empty value; it takes ARM"),
    # 'all' stands alone: in a list it is named as what it is, not as an unknown name
    (["fingerprint", "--op", "conv2d,all"], "op 'all' names every one of conv2d, "),
    (["identify", "--configs", "default,all"], "and stands alone; received 'default,all': give all, or list names"),
    # a shorthand never drops what the user said
    (["train", "--compare-loss-scaling", "--loss-scale", "none"],
     "--loss-scale with --compare-loss-scaling is the static arm's scale (a number; none and dynamic are arms "
     "already); received --loss-scale none"),
    (["train", "--compare-loss-scaling", "--loss-scale", "dynamic"], "received --loss-scale dynamic"),
    (["train", "--compare-loss-scaling", "--loss-scale", "128", "--no-skip"],
     "--no-skip applies to a static --loss-scale (a number); received it with --compare-loss-scaling"),
]


@pytest.mark.parametrize("tf_config,message", [
    ("{", "TF_CONFIG must be JSON like"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}}',
     "may hold only 'worker' jobs"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 3}}', "an index from 0 to 1"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}', "at least 2 workers"),
    ('{"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}}', "a list of host:port"),
])
def test_a_bad_tf_config_is_one_line_before_tensorflow(tmp_path, monkeypatch, tf_config, message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    code, out, err = _run(["train", "--distribute", "multi-worker", "--output", str(tmp_path / "run")], tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv,message", CLI_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_cli_bad_input_is_one_line_with_exit_2(tmp_path, argv, message):
    (tmp_path / "file").write_text("a file, not a directory")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _run(argv, tmp_path)
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def _api_cases():
    from convprobe import analysis
    from convprobe import emulation as em
    from convprobe.testing import assert_within_error_bound

    m = em.parse_model("sequential:fp16")
    x = np.ones((1, 4, 4, 2), np.float16)
    return [
        (lambda: em.conv2d(x, np.ones((0, 3, 2, 2), np.float16), m), "must have H, W, I, O of at least 1"),
        (lambda: em.conv2d(x, np.ones((3, 3, 2, 0), np.float16), m), "must have H, W, I, O of at least 1"),
        (lambda: em.conv2d(x, np.ones((3, 3, 3, 2), np.float16), m), "must equal x channels"),
        (lambda: em.conv2d(x[0], np.ones((3, 3, 2, 2), np.float16), m), "must be a 4-D NHWC array"),
        (lambda: em.conv2d(np.ones((1, 0, 4, 2), np.float16), np.ones((1, 1, 2, 2), np.float16), m),
         "must have H, W, C of at least 1"),
        (lambda: em.conv2d(x, np.ones((3, 3, 2, 2), np.float16), m, padding="FULL"), "padding must be one of"),
        (lambda: em.conv2d(x, np.ones((3, 3, 2, 2), np.float16), m, strides=0), "strides must be a positive"),
        (lambda: em.conv2d(x, np.ones((5, 5, 2, 2), np.float16), m), "is too small for a 5x5 filter"),
        (lambda: em.conv2d(np.array([["a"]]), np.ones((1, 1, 1, 1)), m), "must be a numeric array"),
        # the shape is checked before the values (float64 values whose products are not exact)
        (lambda: em.conv2d(np.full((4, 4, 2), 0.1), np.ones((3, 3, 2, 2), np.float16), m), "must be a 4-D NHWC array"),
        (lambda: em.dot(np.full(8, 0.1, np.float32), np.array(["a"] * 8), em.parse_model("a100")),
         "b must be a numeric array"),
        (lambda: em.dot(np.float16(1), np.float16(2), m), "must have at least one axis to reduce"),
        (lambda: em.dot(np.ones(3), np.ones(4), m), "same last axis length"),
        (lambda: em.dot(np.ones((2, 3)), np.ones((3, 3)), m), "leading shapes must broadcast"),
        (lambda: em.dot(np.ones(3), np.ones(3), m, c=np.zeros(())), "needs a block-FMA model"),
        (lambda: em.dot(np.ones(8, np.float16), np.ones(8, np.float16), em.parse_model("a100"),
                        c=np.ones(3)), "c must broadcast to the result shape"),
        (lambda: em.dot(np.full(8, 0.1, np.float32), np.ones(8, np.float32), em.parse_model("a100")),
         "not fp16 numbers"),
        (lambda: em.round_to_format(np.array(["a"]), "fp16"), "values must be numbers"),
        (lambda: em.round_to_format("1.0", "fp16"), "values must be numbers"),
        (lambda: em.round_to_format(np.ones(2), "fp12"), "fmt must be one of"),
        (lambda: em.round_to_format(np.ones(2), "fp16", "up"), "rounding must be one of"),
        (lambda: em.round_to_format(np.ones(2), "fp16", "stochastic"), "rng must be a numpy Generator"),
        (lambda: em.parse_model(""), "model spec must be a non-empty string"),
        (lambda: em.parse_model("h100:out=fp64"), "out must be one of fp32, fp16"),
        (lambda: em.parse_model("splitk(0, a100)"), "parts must be an integer >= 1"),
        # a spec never takes a key twice (the last one won without a word)
        (lambda: em.parse_model("sequential:fp16:out=fp16:out=fp32"),
         "sequential spec 'sequential:fp16:out=fp16:out=fp32' gives output twice ('fp16' and 'fp32'); give it once"),
        (lambda: em.parse_model("chunked:fp16:n=64:chunk=32"), "gives chunk twice (64 and 32)"),
        (lambda: em.parse_model("sequential:fp16:accumulator=fp32"), "gives accumulator twice ('fp16' and 'fp32')"),
        (lambda: em.parse_model("v100:out=fp16:out=fp32"), "v100 spec 'v100:out=fp16:out=fp32' gives output twice"),
        (lambda: em.parse_model("lanes:fp32:w=8:w=4"), "gives w twice ('8' and '4')"),
        (lambda: em.parse_model("splitk(2, a100, combine=fp32, combine=fp16)"), "gives combine twice"),
        (lambda: em.parse_model("tree((0 1), accumulator=fp32, acc=fp16)"), "gives accumulator twice"),
        (lambda: em.Blocked("fp32", b=4, rounding="stochastic"), "rounding of a blocked model"),
        (lambda: em.Blocked("fp32", b=4, step=6), "step must be a multiple of b"),
        (lambda: em.Sequential("fp16", rounding="stochastic", rbits=True), "rbits must be an integer from 1 to 32"),
        (lambda: em.Sequential("fp16", rounding="stochastic", rbits=13.0), "rbits must be an integer from 1 to 32"),
        (lambda: em.Sequential("fp16", seed=np.float64(3)), "seed must be an integer"),
        # a keyword the kind does not read is refused; a reference that cannot be the scale too
        (lambda: assert_within_error_bound(np.ones(2, np.float32), np.ones(2), 16, lam=1e9),
         "lam applies to kind='probabilistic'; received lam=1000000000.0 with kind='deterministic'"),
        (lambda: assert_within_error_bound(np.ones(2, np.float32), np.ones(2), 16, internal="fp32"),
         "internal applies to kind='blocked'; received internal='fp32' with kind='deterministic'"),
        (lambda: analysis.dot_error_bound(16, "fp16", "probabilistic", block_size=4),
         "block_size applies to kind='blocked'; received block_size=4 with kind='probabilistic'"),
        (lambda: assert_within_error_bound(np.array([1.0, 2.0]), np.array([np.nan, 2.0]), 16),
         "reference must be finite where it is the scale S = |reference| (no abs_sum given); received nan at "
         "(0,), where actual is 1.0"),
        (lambda: analysis.ulp_distance(np.ones(2), np.ones(3), "fp16"), "must have broadcastable shapes"),
        (lambda: analysis.ulp_distance(np.array([0.1]), np.array([1.0]), "fp16"), "representable"),
    ]


API_CASES = _api_cases()


@pytest.mark.parametrize("index", range(len(API_CASES)))
def test_api_bad_input_raises_invalid_argument_with_the_allowed_set(index):
    call, message = API_CASES[index]
    with np.errstate(all="ignore"), pytest.raises(InvalidArgument) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_suite_has_at_least_60_distinct_cases():
    assert len(CLI_CASES) + len(API_CASES) >= 60
    assert len({tuple(a) for a, _ in CLI_CASES}) == len(CLI_CASES)


def test_integers_are_python_or_numpy_integers_never_bools():
    """`errors.is_integer`, the one test every integer argument uses: a NumPy integer
    passes (a seed or rbits taken from an array), a bool, a float or a string does not."""
    from convprobe import emulation as em
    from convprobe.errors import is_integer

    assert all(is_integer(v) for v in (0, -3, 2**70, np.int64(5), np.uint8(1)))
    assert not any(is_integer(v) for v in (True, np.bool_(True), 1.0, np.float64(2), "1", None))
    assert em.Sequential("fp16", rounding="stochastic", rbits=np.int64(20)).rbits == 20


def _options_taking_values():
    from convprobe.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.nargs == "A...").choices  # argparse's subparsers
    return [(name, action.option_strings) for name, command in commands.items() for action in command._actions
            if action.option_strings and action.nargs != 0]


@pytest.mark.parametrize("command, options", _options_taking_values())
def test_every_option_refuses_an_empty_value_in_one_line(tmp_path, command, options):
    for option in options:
        code, out, err = _run([command, option, ""], tmp_path)
        assert code == 2 and out == "", (code, err)
        assert err.strip().splitlines() == [
            f"convprobe {command}: error: argument {'/'.join(options)}: received an empty value; it takes "
            + err.split("it takes ", 1)[-1].strip()], err


KERAS_FILES = {  # what is at the path, and the one line that refuses it
    "FIFO": (lambda p: os.mkfifo(p), "is not a regular file (a FIFO, socket or device)"),
    "link to /dev/zero": (lambda p: p.symlink_to("/dev/zero"), "is not a regular file (a FIFO, socket or device)"),
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "text": (lambda p: p.write_text("a model\n"), "is not a saved Keras model: a .keras file is a zip archive, and "
                                                  "this one starts with b'a mo'"),
    "directory": (lambda p: p.mkdir(), "is a directory, not a file"),
    "broken link": (lambda p: p.symlink_to(p.parent / "nowhere"), "is a broken symbolic link"),
    "zip of no model": (lambda p: zipfile.ZipFile(p, "w").writestr("notes.txt", "hello"),
                        "could not be loaded as a Keras model: "),
}


@pytest.mark.parametrize("case", KERAS_FILES)
def test_a_keras_model_file_is_checked_before_keras_opens_it(tmp_path, case):
    """A process, with a timeout: a FIFO handed to Keras would block it for ever."""
    make, message = KERAS_FILES[case]
    path = tmp_path / "model.keras"
    make(path)
    proc = run_cli("identify", "--keras-model", str(path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"convprobe identify: error: --keras-model {str(path)!r} " + proc.stderr.split(f"{str(path)!r} ", 1)[-1].strip()]
    assert message in proc.stderr and proc.stdout == "", proc.stderr
