"""README.md and docs/ are a manual, not a lab notebook.

History belongs in CHANGELOG.md; a measurement names its command, machine and versions, not
the commit it was made at. So no page may carry a commit-hash-like token, or talk of the
work sessions ("stops") it was written in.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: A whole word of 7 to 40 hex digits: a commit hash or its abbreviation.
HEX_WORD = re.compile(r"\b[0-9A-Fa-f]{7,40}\b")
#: Scientific notation such as 1e10000 is a number, not a hash.
SCIENTIFIC = re.compile(r"\d+[eE]\d+")
#: "stop"/"stops" as a work session: "this stop", "an earlier stop", "later stops", "last
#: stop". Ordinary verbs ("stops matching", "stops the recovery", "and stops every worker")
#: are not preceded by these words.
SESSION_STOP = re.compile(
    r"\b(?:this|that|these|those|earlier|later|last|previous|next|each|every|past|prior|"
    r"current|new|same|first|second|third|final|one|two|several)\s+stops?\b",
    re.IGNORECASE,
)


def hash_like(line: str) -> list[str]:
    """The commit-hash-like tokens of a line: a digit and a letter a-f in a whole hex word."""
    return [
        token
        for token in HEX_WORD.findall(line)
        if re.search(r"\d", token) and re.search(r"[A-Fa-f]", token) and not SCIENTIFIC.fullmatch(token)
    ]


def session_stops(line: str) -> list[str]:
    """The phrases of a line that talk of a work session as a stop."""
    return [match.group(0) for match in SESSION_STOP.finditer(line)]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize(
    ("line", "tokens"),
    [
        ("measured at commit 97df084 (15 min 35 s)", ["97df084"]),
        ("at 5a13ece and f02c9cc", ["5a13ece", "f02c9cc"]),
        ("full hash d811f2f0c2a99ef29acb51f02c9cc7d163cf15d1", ["d811f2f0c2a99ef29acb51f02c9cc7d163cf15d1"]),
        ("676,528 outputs, 2**-25, 1234567 terms, 0x7fff0000", []),
        ("deadbeef and facade and accede are words", []),
        ("fp16 bf16 conv2d_backprop_input 1e10000", []),
        ("abc123", []),
    ],
)
def test_hash_like_finds_hashes_and_nothing_else(line, tokens):
    assert hash_like(line) == tokens


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("the one an earlier stop measured", ["earlier stop"]),
        ("On the AMD EPYCs of later stops", ["later stops"]),
        ("measured at this stop; the last stop", ["this stop", "last stop"]),
        ("It stops matching at K = 1024", []),
        ("Any other output stops the recovery and is reported", []),
        ("and stops every worker when one fails", []),
        ("the recovery stops and says so", []),
    ],
)
def test_session_stops_finds_sessions_and_not_verbs(line, found):
    assert session_stops(line) == found


def test_readme_and_docs_have_no_commit_hashes_or_talk_of_stops():
    problems = []
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            problems += [f"{name}:{number}: commit-hash-like token {token!r}" for token in hash_like(line)]
            problems += [f"{name}:{number}: talk of stops {phrase!r}" for phrase in session_stops(line)]
    assert not problems, "history belongs in CHANGELOG.md:\n" + "\n".join(problems)
