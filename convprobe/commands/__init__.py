"""One module per CLI subcommand; each has `register(subparsers)`.

Command modules parse and render only; the work lives in the library.
"""

from convprobe.commands import probe_commands, replay_command, study_commands
from convprobe.training import command as train_command

MODULES = (probe_commands, study_commands, replay_command, train_command)

__all__ = ["MODULES"]
