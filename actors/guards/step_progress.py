"""StepProgress: what the engine thread reports of its steps, and when a step counts as hung.

    out = progress.timed(engine.step)    # on the engine thread, around every step
    progress.stalled(now)                # on the event loop: None, or why the step is hung

The bound a step may run is derived from the model's own measured steps:
`max(floor_s, multiple × the slowest of the last `window` steps)`. Step times vary with the
batch (a long prefill, a first step that compiles or captures graphs), so the bound follows
the slowest recent step, not a typical one, and the floor covers a worker with no history yet.

Pure: no asyncio, no I/O; the clock is passed in. The engine thread writes, the event loop
reads: each value the reader sees is one attribute, assigned whole.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

WINDOW = 256  # recent steps the bound follows
FLOOR_S = 30.0  # a CPU's long prefill or a first step that compiles stays under it
MULTIPLE = 10.0


def stall_bound(recent_s: Iterable[float], floor_s: float, multiple: float) -> float:
    """Seconds a step may run before it counts as hung: `multiple` × the slowest of `recent_s`
    (step durations), never under `floor_s`."""
    return max(floor_s, multiple * max(recent_s, default=0.0))


class StepProgress:
    def __init__(
        self,
        floor_s: float = FLOOR_S,
        multiple: float = MULTIPLE,
        *,
        window: int = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if floor_s <= 0 or multiple <= 0:
            raise ValueError(f"floor_s and multiple must be positive, got {floor_s}, {multiple}")
        self.floor_s = floor_s
        self.multiple = multiple
        self.clock = clock
        self.steps = 0  # steps that returned (or raised)
        self.running_since: float | None = None  # when the step running now began
        self.bound_s = floor_s
        self._recent: deque[float] = deque(maxlen=window)

    def timed(self, step: Callable[[], T]) -> T:
        """Run one step (on the engine thread), reporting its start and its end. A step that
        raises has ended too: the thread came back."""
        start = self.clock()
        self.running_since = start
        try:
            return step()
        finally:
            self._recent.append(self.clock() - start)
            self.bound_s = stall_bound(self._recent, self.floor_s, self.multiple)
            self.steps += 1
            self.running_since = None

    def running_for(self, now: float) -> float:
        """Seconds the step running now has run (0 between steps)."""
        since = self.running_since
        return 0.0 if since is None else max(now - since, 0.0)

    def stalled(self, now: float) -> str | None:
        """Why the engine counts as hung (a step has run past the bound), or None."""
        running, bound = self.running_for(now), self.bound_s
        if running <= bound:
            return None
        return f"engine step running for {running:.1f} s, over its bound of {bound:.1f} s"
