"""The exceptions convprobe raises on purpose.

`InvalidArgument` is bad user input: the CLI turns it into one line on stderr and
exit code 2. `OutputWriteFailed` is a write that failed only when it happened (a
full disk, a file-size limit): one line and exit code 3, the previous file intact.
`UnsupportedConfiguration` means a backend cannot run a setting; a sweep records
it as an "unsupported" row instead of stopping.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (annotations only: errors imports nothing at run time)
    import numpy as np
    from typing_extensions import TypeIs

__all__ = ["ConvprobeError", "InvalidArgument", "OutputWriteFailed", "UnsupportedConfiguration", "invalid_choice", "is_integer", "reason",
           "set_once"]


class ConvprobeError(Exception):
    """Base class of every error convprobe raises deliberately."""


class InvalidArgument(ConvprobeError, ValueError):
    """A user-supplied value is outside the allowed set or range."""


class OutputWriteFailed(ConvprobeError):
    """A result could not be written although its path was checked before the work: the disk
    is full, a file-size limit was reached. Whatever was there before is intact."""


class UnsupportedConfiguration(ConvprobeError):
    """The requested backend configuration cannot run here (no GPU, op missing, ...)."""


def invalid_choice(argument: str, value: object, choices: Iterable[object]) -> InvalidArgument:
    """The one error message shape for closed option sets.

    >>> str(invalid_choice("accumulate", "fp8", ["fp16", "fp32", "default"]))
    "accumulate must be one of fp16, fp32, default; received 'fp8'"
    """
    valid = ", ".join(str(c) for c in choices)
    return InvalidArgument(f"{argument} must be one of {valid}; received {value!r}")


def set_once(keywords: dict, key: str, value: object, what: str) -> None:
    """`keywords[key] = value`, refusing a key given twice: the last one winning without a word
    would run something other than what the user read. `what` names the spec for the message."""
    if key in keywords:
        raise InvalidArgument(f"{what} gives {key} twice ({keywords[key]!r} and {value!r}); give it once")
    keywords[key] = value


def is_integer(value: object) -> TypeIs[int | np.integer[Any]]:
    """Whether a user's value is an integer: a Python or NumPy one, never a bool (which
    Python counts as one), a float or a string. The one test every integer argument uses."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def reason(exc: BaseException) -> str:
    """What went wrong reading a file, in a few words on one line (the OS's words for an OSError)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else exc.__class__.__name__
