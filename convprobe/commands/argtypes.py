"""argparse `type=` converters and option groups shared by the commands.

They raise `argparse.ArgumentTypeError`, which the CLI frame turns into one line
naming the option, the value received and what is allowed, with exit code 2.
"""

from __future__ import annotations

import argparse

from convprobe.render import FORMATS

__all__ = ["positive_int", "seed", "add_running_options", "add_output_options"]


def _integer(text: str, minimum: int, allowed: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"must be {allowed}; received {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (sizes, counts, seconds)."""
    return _integer(text, 1, "a positive integer")


def seed(text: str) -> int:
    """A non-negative integer seed."""
    return _integer(text, 0, "a non-negative integer")


def add_running_options(parser: argparse.ArgumentParser, *, timeout: int) -> None:
    """The "running" group every probe-style command shares: --seed, --timeout, --jobs."""
    run = parser.add_argument_group("running")
    run.add_argument("--seed", type=seed, default=0, help="seed for random inputs (default: 0)")
    run.add_argument("--timeout", type=positive_int, default=timeout, metavar="SECONDS",
                     help=f"per-configuration time limit (default: {timeout})")
    run.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                     help="configurations run at once (default: number of cores)")


def add_output_options(parser: argparse.ArgumentParser, *, format_help: str,
                       output_help: str) -> argparse._ArgumentGroup:
    """The "output" group every probe-style command shares: --format and --output.
    Returns the group, for command-specific output options."""
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS, default="table", help=f"{format_help} (default: table)")
    out.add_argument("--output", metavar="FILE", help=output_help)
    return out
