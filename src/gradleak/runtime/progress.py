"""The progress bar of a run: rich, on stderr, and a live widget in Jupyter (rich detects
the notebook itself)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# update(done, total): called as steps finish
Advance = Callable[[int, int], None]


def bars(console: Console | None = None) -> Progress:
    """Progress bars on stderr with the description, done / total, elapsed time and ETA,
    gone when their block ends (the result is what stays)."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())  # fmt: skip
    return Progress(*columns, console=console or Console(stderr=True), transient=True)


@contextlib.contextmanager
def progress_bar(description: str, total: int) -> Iterator[Advance]:
    """A bar for ``total`` steps, gone when the block ends (the result is what stays)."""
    with bars() as bar:
        task = bar.add_task(description, total=total)
        yield lambda done, total: bar.update(task, completed=done, total=total)
