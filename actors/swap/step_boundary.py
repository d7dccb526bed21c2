"""What a model swap asks of the GPU actor, done only between two engine steps.

A swap runs in its own task, beside the GPU actor's loop. It never touches the engines while
a step may be running; it files a request here and awaits its future, which the GPU actor's
loop resolves at its next step boundary:

- `flip`: make the standby engine active (returns the ms the flip took);
- `release`: drop the standby engine once it has finished its sequences;
- `quiet`: resolved once admission is paused and no engine has work (drain mode).

When the actor stops or crashes, every pending request is cancelled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepBoundary:
    flip: tuple[Any, asyncio.Future[float]] | None = None  # (engine to flip to, done)
    release: list[asyncio.Future[None]] = field(default_factory=list)
    quiet: list[asyncio.Future[None]] = field(default_factory=list)

    def pending(self) -> bool:
        """Something the loop must not sleep through."""
        return self.flip is not None or bool(self.release) or bool(self.quiet)

    def cancel_all(self) -> None:
        futures: list[asyncio.Future[Any]] = [*self.release, *self.quiet]
        if self.flip is not None:
            futures.append(self.flip[1])
        for future in futures:
            if not future.done():
                future.cancel()
        self.flip, self.release, self.quiet = None, [], []


def new_future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


def resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
