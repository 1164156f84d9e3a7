"""One module per CLI subcommand; each has `register(subparsers)`.

Command modules parse and render only; the work lives in the library.
"""

from convprobe.commands import probe_commands

MODULES = (probe_commands,)

__all__ = ["MODULES"]
