"""The run's progress bar: episodes done out of planned, failed so far, time elapsed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from parley.arena.run.records import EpisodeRecord

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar(
    console: Console, title: str, total: int, *, enabled: bool = True
) -> Iterator[Callable[[EpisodeRecord], None]]:
    """Yields ``advance(record)``, to call once per finished episode (a no-op when not
    ``enabled``)."""
    if not enabled:
        yield lambda record: None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(title, total=total, failed=0)
        failed = 0

        def advance(record: EpisodeRecord) -> None:
            nonlocal failed
            failed += bool(record.failed)
            progress.update(task, advance=1, failed=failed)

        yield advance
