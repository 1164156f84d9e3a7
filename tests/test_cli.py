"""The command line as a user meets it: help, bad input, exit codes."""

import subprocess
import sys

import pytest

from conftest import run_cli


def test_help_is_useful_and_never_imports_tensorflow():
    code = (
        "import sys, io, contextlib\n"
        "from convprobe.cli import main\n"
        "for argv in (['--help'], ['overflow', '--help'], ['compare', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit as e:\n"
        "            assert e.code == 0\n"
        "    assert '--accumulate' in out.getvalue() or 'overflow' in out.getvalue()\n"
        "assert 'tensorflow' not in sys.modules, 'help imported tensorflow'\n"
        "import convprobe, convprobe.backends, convprobe.probes\n"
        "assert 'tensorflow' not in sys.modules, 'importing convprobe imported tensorflow'\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_python_dash_m_shows_the_commands():
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "overflow" in proc.stdout and "compare" in proc.stdout


@pytest.mark.parametrize("args,expected", [
    (["overflow", "--accumulate", "fp8"], "argument --accumulate: invalid choice: 'fp8' (choose from 'fp16', 'fp32', 'default', 'all')"),
    (["overflow", "--format", "xml"], "argument --format: invalid choice: 'xml' (choose from 'table', 'json', 'csv')"),
    (["compare", "--backend", "mxnet"], "argument --backend: invalid choice: 'mxnet'"),
    (["overflow", "--env", "NOEQUALS"], "env must be NAME=VALUE"),
    (["compare", "--batch", "0"], "argument --batch: must be an integer from 1 to 4096; received '0'"),
    (["compare", "--kernel", "40"], "kernel must be at most height and width (32); received 40"),
    (["overflow", "--seed", "-1"], "argument --seed: must be an integer from 0 to 2**63 - 1"),
    (["overflow", "--backend", "tensorflow", "--model", "sequential:fp16"], "model applies only to --backend emulated"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_gpu_requested_without_a_gpu_is_one_line_and_exit_2():
    proc = run_cli("overflow", "--device", "gpu", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "convprobe overflow: error: device gpu was requested but no GPU is visible on this machine; "
        "use --device cpu or auto, or ask the GPU question from this CPU with the tensor cores' emulated presets "
        "(--backend emulated --model v100:out=fp16, a100, h100)"
    )


def test_no_command_prints_help_and_exits_2():
    proc = run_cli()
    assert proc.returncode == 2 and "overflow" in proc.stdout


def test_gpu_rows_can_be_listed_on_a_machine_without_a_gpu():
    proc = run_cli("fingerprint", "--list-configs", "--device", "gpu")
    assert proc.returncode == 0, proc.stderr
    assert "fp16-compute" in proc.stdout and "TF_FP16_CONV_USE_FP32_COMPUTE=0" in proc.stdout


def test_a_switch_inherited_from_the_shell_is_named_on_stderr():
    proc = run_cli("overflow", "--backend", "emulated", "--accumulate", "fp16",
                   env={"TF_FP16_CONV_USE_FP32_COMPUTE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert ("note: ignoring TF_FP16_CONV_USE_FP32_COMPUTE=0 from your environment" in proc.stderr)


def test_a_gpu_switch_on_the_cpu_says_it_has_no_effect_in_the_table_and_the_json():
    proc = run_cli("overflow", "--backend", "tensorflow", "--accumulate", "default",
                   "--env", "TF_FP16_CONV_USE_FP32_COMPUTE=0")
    assert proc.returncode == 0, proc.stderr
    assert "note: TF_FP16_CONV_USE_FP32_COMPUTE=0 has no effect on the CPU" in proc.stdout


def test_a_gpu_only_switch_on_the_cpu_says_no_effect_in_the_verdict():
    from convprobe.backends.configurations import resolve_configs
    from convprobe.probes.result import ProbeResult
    from convprobe.probes.runner import annotate

    (config,) = resolve_configs(backend="tensorflow", accumulate="fp16", device="cpu",
                                extra_env={"TF_FP16_CONV_USE_FP32_COMPUTE": "0"})
    result = annotate(ProbeResult("overflow", config, "ok"),
                      {"accumulation": "fp32", "arithmetic": "wide", "verdict": "fp32 accumulation", "evidence": ""})
    assert result.verdict.startswith("no effect: TF_FP16_CONV_USE_FP32_COMPUTE=0 acts only on a GPU;")
    assert result.to_record()["config"]["warnings"]  # and the JSON says why


def test_progress_is_drawn_on_a_terminal_and_silent_otherwise(capsys):
    from convprobe.progress import tracker

    with tracker(3, "units", enabled=True) as advance:
        for i in range(3):
            advance(f"unit {i}")
    drawn = capsys.readouterr().err
    assert "units" in drawn and "3/3" in drawn
    with tracker(3, "units") as advance:  # stderr is not a terminal under pytest
        advance()
    assert capsys.readouterr().err == ""
