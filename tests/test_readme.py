"""The README is the front door: its generated parts must match the code."""

from pathlib import Path

from convprobe.backends.configurations import settings_table_markdown

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The full guide (docs/guide.md): the README's front door links to it for the details.
GUIDE = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")


def test_readme_settings_table_is_the_code_s_table():
    assert settings_table_markdown() in README


def test_quick_start_has_exactly_the_two_commands_and_ci_runs_the_second():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0].strip() for b in quick.split("```bash\n")[1:]]
    assert len(blocks) == 2
    assert blocks[0].endswith("convprobe overflow --accumulate fp16")
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text(encoding="utf-8")
    assert blocks[1].replace('pip install -e "', 'pip install -q -e "') in ci


def test_the_guide_defines_every_record_column_as_header_json_does():
    from convprobe.training.records import COLUMN_DEFINITIONS

    for part, definitions in COLUMN_DEFINITIONS.items():
        for column, definition in definitions.items():
            assert f"| `{column}` | {definition.replace('|', '/')} |" in GUIDE, (part, column)


def test_the_readme_is_a_front_door():
    """At most 250 lines, no commit hashes; every docs/ page it links to exists."""
    import re

    assert len(README.splitlines()) <= 250
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", README)
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), target
