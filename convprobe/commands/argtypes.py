"""argparse `type=` converters and option groups shared by the commands.

They raise `argparse.ArgumentTypeError`, which the CLI frame turns into one line
naming the option, the value received and what is allowed, with exit code 2.
"""

from __future__ import annotations

import argparse

from convprobe.render import FORMATS

__all__ = ["positive_int", "bounded_int", "int_list", "seed", "add_running_options",
           "add_output_options", "check_output", "announce_inherited_switches", "MAX_TIMEOUT",
           "MAX_JOBS"]

MAX_TIMEOUT = 7 * 24 * 3600  # a week: longer is a typo, and overflows some timers
MAX_JOBS = 256


def _integer(text: str, minimum: int, allowed: str, maximum: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        raise argparse.ArgumentTypeError(f"must be {allowed}; received {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (sizes, counts, seconds)."""
    return _integer(text, 1, "a positive integer")


def bounded_int(low: int, high: int):
    """An argparse type: an integer in [low, high], the range named in the error."""
    def convert(text: str) -> int:
        return _integer(text, low, f"an integer from {low} to {high}", high)

    convert.__name__ = f"integer in [{low}, {high}]"
    return convert


def int_list(low: int, high: int):
    """An argparse type: comma-separated integers, each in [low, high], at least one."""
    def convert(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or min(values) < low or max(values) > high:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated integers from {low} to {high}; received {text!r}")
        return values

    return convert


def seed(text: str) -> int:
    """A non-negative integer seed below 2**63."""
    return _integer(text, 0, "an integer from 0 to 2**63 - 1", 2**63 - 1)


def add_running_options(parser: argparse.ArgumentParser, *, timeout: int) -> None:
    """The "running" group every probe-style command shares: --seed, --timeout, --jobs."""
    run = parser.add_argument_group("running")
    run.add_argument("--seed", type=seed, default=0, help="seed for random inputs (default: 0)")
    run.add_argument("--timeout", type=bounded_int(1, MAX_TIMEOUT), default=timeout, metavar="SECONDS",
                     help=f"per-configuration time limit, 1 to {MAX_TIMEOUT} (default: {timeout})")
    run.add_argument("--jobs", type=bounded_int(1, MAX_JOBS), default=None, metavar="N",
                     help=f"configurations run at once, 1 to {MAX_JOBS} (default: number of cores)")


def add_output_options(parser: argparse.ArgumentParser, *, format_help: str,
                       output_help: str) -> argparse._ArgumentGroup:
    """The "output" group every probe-style command shares: --format and --output.
    Returns the group, for command-specific output options."""
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS, default="table", help=f"{format_help} (default: table)")
    out.add_argument("--output", metavar="FILE", help=output_help)
    return out


def check_output(path: str | None, file_format: str, allowed: tuple[str, ...] | None = None) -> None:
    """Refuse an --output before any work: unwritable, a directory, or a suffix that contradicts
    `file_format` (or, with `allowed`, a suffix outside it)."""
    if not path:
        return
    from pathlib import Path

    from convprobe.errors import InvalidArgument
    from convprobe.render import check_output_path

    suffix = Path(path).suffix.lower().lstrip(".")
    if allowed is not None and suffix not in allowed:
        raise InvalidArgument(f"--output must end in {' or '.join('.' + a for a in allowed)}; "
                              f"received {path!r}")
    check_output_path(path, suffix if allowed is not None else file_format)


def announce_inherited_switches(command: str) -> None:
    """Name, on stderr, the precision switches of the user's shell that no child will see."""
    import sys

    from convprobe.backends.configurations import inherited_switches

    found = inherited_switches()
    if found:
        shown = " ".join(f"{k}={v}" for k, v in found.items())
        print(f"convprobe {command}: note: ignoring {shown} from your environment: each configuration "
              f"sets its own switches (pass one on purpose with --env NAME=VALUE)", file=sys.stderr)
