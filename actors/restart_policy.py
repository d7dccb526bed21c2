"""When to restart a crashed child, and when to give up: one-for-one, bounded, with backoff.

Each child has its own record of recent crashes. A crash within the window is allowed up to
`max_restarts` times, each after an exponentially growing pause; one more and the policy says
give up (`None`), so the worker drains and exits non-zero for its orchestrator to replace it.
Pure logic with an explicit clock, so it is tested without waiting.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field


@dataclass
class RestartPolicy:
    max_restarts: int = 5
    window_s: float = 60.0
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 10.0
    _crashes: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ValueError("max_restarts must be ≥ 0 and window_s positive")

    def on_crash(self, child: str, now: float) -> float | None:
        """Record a crash; the seconds to wait before restarting, or None to give up."""
        crashes = self._crashes[child]
        while crashes and crashes[0] <= now - self.window_s:
            crashes.popleft()
        crashes.append(now)
        if len(crashes) > self.max_restarts:
            return None
        return float(min(self.initial_backoff_s * 2 ** (len(crashes) - 1), self.max_backoff_s))

    def recent(self, child: str) -> int:
        """Crashes of `child` in the current window (as of its last crash)."""
        return len(self._crashes[child])

    def total(self) -> int:
        return sum(len(c) for c in self._crashes.values())
