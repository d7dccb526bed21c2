"""How a batch run shows progress: a rich bar on a terminal, a line every few seconds elsewhere."""

from __future__ import annotations

import sys
import time
from typing import Protocol

import click
from rich import progress as rich_progress
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)


class Progress(Protocol):
    """What a batch run tells about its progress."""

    def started(self, total: int, already: int) -> None: ...
    def answered(self, ok: bool, completion_tokens: int) -> None: ...
    def finished(self) -> None: ...


class _Counts:
    def __init__(self) -> None:
        self.total = 0
        self.done = 0
        self.errors = 0
        self.tokens = 0
        self.since = time.monotonic()

    def add(self, ok: bool, completion_tokens: int) -> None:
        self.done += 1
        self.errors += not ok
        self.tokens += completion_tokens

    def tokens_per_s(self) -> float:
        return self.tokens / max(time.monotonic() - self.since, 1e-9)


class BarProgress:
    """done / total, tokens/s, errors and ETA, redrawn at most ten times a second."""

    def __init__(self) -> None:
        self._counts = _Counts()
        self._bar = rich_progress.Progress(
            TextColumn("[bold]batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tps]:>8.1f} tok/s"),
            TextColumn("[red]{task.fields[errors]} errors"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._task: TaskID | None = None
        self._drawn = 0.0

    def started(self, total: int, already: int) -> None:
        self._counts.total, self._counts.done = total, already
        self._task = self._bar.add_task("batch", total=total, completed=already, tps=0.0, errors=0)
        self._bar.start()

    def answered(self, ok: bool, completion_tokens: int) -> None:
        self._counts.add(ok, completion_tokens)
        if (now := time.monotonic()) - self._drawn > 0.1:
            self._drawn = now
            self._draw()

    def finished(self) -> None:
        self._draw()
        self._bar.stop()

    def _draw(self) -> None:
        if self._task is not None:
            counts = self._counts
            self._bar.update(
                self._task,
                completed=counts.done,
                tps=counts.tokens_per_s(),
                errors=counts.errors,
            )


class LineProgress:
    """For logs and pipes: one line on stderr every `every_s` seconds, and one at the end."""

    def __init__(self, every_s: float = 10.0) -> None:
        self._counts = _Counts()
        self._every_s = every_s
        self._said = time.monotonic()

    def started(self, total: int, already: int) -> None:
        self._counts.total, self._counts.done = total, already
        if already:
            click.echo(f"batch: resuming, {already} of {total} lines already answered", err=True)

    def answered(self, ok: bool, completion_tokens: int) -> None:
        self._counts.add(ok, completion_tokens)
        if (now := time.monotonic()) - self._said >= self._every_s:
            self._said = now
            self._say()

    def finished(self) -> None:
        self._say()

    def _say(self) -> None:
        c = self._counts
        click.echo(
            f"batch: {c.done}/{c.total} answered, {c.errors} errors, {c.tokens_per_s():.1f} tok/s",
            err=True,
        )


class NoProgress:
    def started(self, total: int, already: int) -> None:
        pass

    def answered(self, ok: bool, completion_tokens: int) -> None:
        pass

    def finished(self) -> None:
        pass


def progress_for(show: bool | None) -> Progress:
    """`show` True: a bar; False: nothing; None: a bar on a terminal, lines otherwise."""
    if show is False:
        return NoProgress()
    return BarProgress() if show or sys.stderr.isatty() else LineProgress()
