"""RssTrend: the resident set's samples over a window, and how fast it grows.

Pure: the memory guard adds a sample (monotonic seconds, bytes) now and then; the growth rate
is the slope from the window's oldest sample to its newest, so one spike (a large prefill's
buffers) moves it little while a steady leak shows as a steady rate.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 60.0


class RssTrend:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, rss: int) -> None:
        """A sample taken at `now`; those older than the window (but the newest before it,
        kept as the slope's start) are dropped."""
        self._samples.append((now, rss))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    @property
    def rss(self) -> int | None:
        """The newest sample, if any."""
        return self._samples[-1][1] if self._samples else None

    @property
    def growth_bytes_per_s(self) -> float:
        """Bytes per second from the oldest sample kept to the newest (0 with fewer than two)."""
        if len(self._samples) < 2:
            return 0.0
        (t0, rss0), (t1, rss1) = self._samples[0], self._samples[-1]
        return (rss1 - rss0) / (t1 - t0) if t1 > t0 else 0.0
