"""Progress of long commands on stderr, drawn by rich; silent when stderr is not a terminal.

`tracker(total, description)` is a context manager that yields `advance(status="")`:
call it once per finished unit (a configuration, a training step, a replayed set).
Nothing is drawn when `enabled` is False or, by default, when stderr is not a terminal,
so pipes, CI logs and tests see only the results. Safe to advance from worker threads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["tracker"]


@contextmanager
def tracker(total: int, description: str, *, enabled: bool | None = None) -> Iterator[Callable[..., None]]:
    """Yield `advance(status="")`; a rich progress bar on stderr while the block runs."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled or total <= 0:
        yield lambda status="": None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task(description, total=total, status="")

        def advance(status: str = "") -> None:
            progress.update(task, advance=1, status=status)

        yield advance
