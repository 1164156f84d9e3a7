"""The `convprobe` command line: one thin module per command over the library.

Each command module (`COMMANDS`) exposes `register(subparsers)`, which adds its
parser and sets `handler=` to a function `(args) -> int` that parses, calls one
library function and renders. Nothing here imports TensorFlow: help is instant and
works without it. Bad input raises `InvalidArgument`, which becomes one line on
stderr and exit code 2; exit 1 is kept for a failed --expect (or replay mismatch); a
write that fails only when it happens (`OutputWriteFailed`: a full disk, a file-size
limit) is one line and exit code 3, with the previous file intact.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from convprobe import __version__
from convprobe.cli import compare, contract, fingerprint, identify, overflow, replay, report, sweep, train
from convprobe.errors import InvalidArgument, OutputWriteFailed

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_EXPECTATION_FAILED", "EXIT_USAGE",
           "EXIT_WRITE_FAILED"]

#: The command modules, in help order.
COMMANDS = (overflow, compare, fingerprint, contract, identify, sweep, report, replay, train)

EXIT_OK = 0
EXIT_EXPECTATION_FAILED = 1
EXIT_USAGE = 2
EXIT_WRITE_FAILED = 3  # a checked output could not be written after all (disk full, file-size limit)


class _StoreOnce(argparse._StoreAction):
    """argparse's plain `store`, except that an option given twice is refused: keeping the last
    value without a word would record one setting while the user believed in another."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault(_SEEN, {})
        if option_string is not None and self.dest in seen:
            parser.error(f"argument {option_string}: given twice ({seen[self.dest]!r} and {values!r}); "
                         f"it takes one value")
        seen[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


_SEEN = "_options_seen"  # where _StoreOnce keeps what it saw during one parse


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage in one line (no usage dump) with exit 2, refuses a
    single-valued option given twice, and takes options only by their full names (an
    abbreviation could not be stripped from what `train --local-workers` passes on to its
    workers)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def _get_value(self, action, arg_string):
        """Every value is converted here (argparse's hook), so an empty one is refused here for
        every option and argument: taken as 'not given', it would run something the user did
        not ask for."""
        passed_on = action.nargs in (argparse.PARSER, argparse.REMAINDER)  # a command's own parser checks them
        if isinstance(arg_string, str) and not arg_string.strip() and not passed_on:
            name = "/".join(action.option_strings) or action.metavar or action.dest
            takes = (f"one of {', '.join(map(str, action.choices))}" if action.choices is not None
                     else action.metavar or action.dest.upper())
            default = " (leave the option out for its default)" if action.option_strings and action.default else ""
            self.error(f"argument {name}: received an empty value; it takes {takes}{default}")
        return super()._get_value(action, arg_string)

    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse API
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
    args.__dict__.pop(_SEEN, None)
    args.argv = argv  # what was typed: `train --local-workers` starts each worker with it
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # here, where a failing terminal or file is one line, not a lost exit code
        return code
    except InvalidArgument as error:
        print(f"convprobe {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OutputWriteFailed as error:
        print(f"convprobe {args.command}: error: {error}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except BrokenPipeError:  # the reader went away (`| head`): what it wanted it has
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except OSError as error:
        if error.errno not in _WRITE_ERRORS:
            raise
        where = repr(error.filename) if error.filename else "standard output"
        if not error.filename:
            _silence_stdout()  # what is still buffered would fail again at exit, with a traceback
        print(f"convprobe {args.command}: error: could not write to {where}: {error.strerror}; files written "
              f"with --output are complete", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except KeyboardInterrupt:
        print(f"convprobe {args.command}: interrupted", file=sys.stderr)
        return 130


#: The errors of a write that was possible when the command started: a full disk or quota, a
#: file-size limit, a device error.
_WRITE_ERRORS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO}


def _silence_stdout() -> None:
    """Point standard output at /dev/null, so that Python's flush at exit finds nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
