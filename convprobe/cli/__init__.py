"""The `convprobe` command line: one thin module per command over the library.

Each command module (`COMMANDS`) exposes `register(subparsers)`, which adds its
parser and sets `handler=` to a function `(args) -> int` that parses, calls one
library function and renders. Nothing here imports TensorFlow: help is instant and
works without it. Bad input raises `InvalidArgument`, which becomes one line on
stderr and exit code 2; exit 1 is kept for a failed --expect (or replay mismatch).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from convprobe import __version__
from convprobe.cli import compare, fingerprint, identify, overflow, replay, report, sweep, train
from convprobe.errors import InvalidArgument

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_EXPECTATION_FAILED", "EXIT_USAGE"]

#: The command modules, in help order.
COMMANDS = (overflow, compare, fingerprint, identify, sweep, report, replay, train)

EXIT_OK = 0
EXIT_EXPECTATION_FAILED = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage in one line (no usage dump) with exit 2, and takes
    options only by their full names (an abbreviation could not be stripped from what
    `train --local-workers` passes on to its workers)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="convprobe",
        description=(
            "Find out what arithmetic a framework really does when it runs an fp16 "
            "convolution: probes on real TensorFlow (each precision setting in its own "
            "process), an exact emulator of low-precision accumulation, and analysis."
        ),
        epilog="Run 'convprobe COMMAND --help' for each command's options.",
    )
    parser.add_argument("--version", action="version", version=f"convprobe {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # what was typed: `train --local-workers` starts each worker with it
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.handler(args))
    except InvalidArgument as error:
        print(f"convprobe {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"convprobe {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
