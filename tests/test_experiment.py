"""The experiment scripts' shared arguments: config overrides and the output folder."""

import json
from pathlib import Path

from convprobe import experiment


def test_parser_defaults_sit_next_to_the_script(tmp_path):
    args = experiment.parser("Title line.\n\nmore", tmp_path).parse_args([])
    assert Path(args.config) == tmp_path / "config.json"
    assert Path(args.output) == tmp_path / "results"
    assert experiment.parser("t", tmp_path).parse_args(["--output", "elsewhere"]).output == "elsewhere"


def test_every_experiment_has_full_help_and_its_own_output_folder():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1] / "experiments"
    for script in sorted(root.glob("*/run.py")):
        proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                              cwd="/")  # run from elsewhere: the default output stays in the study folder
        assert proc.returncode == 0, proc.stderr
        assert "--config FILE" in proc.stdout and "the study's parameters" in " ".join(proc.stdout.split()), script
        assert f"(default: {script.parent.name}/results)" in " ".join(proc.stdout.split()), script


def test_load_applies_overrides_that_are_set_and_creates_the_output(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"steps": 10, "seed": 3}), encoding="utf-8")
    out = tmp_path / "a" / "b"
    args = experiment.parser("t", tmp_path).parse_args(["--output", str(out)])
    config, output = experiment.load(args, steps=4, seed=None, extra=1)
    assert config == {"steps": 4, "seed": 3, "extra": 1}
    assert output == out and out.is_dir()
