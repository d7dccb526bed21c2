"""Pause and resume fetching by outstanding work, with hysteresis. Pure Python, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Backpressure", "Decision", "Watermarks"]


@dataclass(frozen=True)
class Watermarks:
    """High watermarks pause fetching; low ones (default: half the high) resume it."""

    high_requests: int = 512
    high_tokens: int = 262144
    low_requests: int | None = None
    low_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.high_requests <= 0 or self.high_tokens <= 0:
            raise ValueError("high_requests and high_tokens must be positive")
        if self.low_requests is None:
            object.__setattr__(self, "low_requests", self.high_requests // 2)
        if self.low_tokens is None:
            object.__setattr__(self, "low_tokens", self.high_tokens // 2)
        for name, low, high in (
            ("requests", self.low_requests, self.high_requests),
            ("tokens", self.low_tokens, self.high_tokens),
        ):
            if low is None or not 0 <= low < high:
                raise ValueError(f"low_{name} must be in [0, high_{name}={high}), got {low}")


class Decision(enum.Enum):
    PAUSE = "pause"
    RESUME = "resume"
    NONE = "none"  # the paused state did not change


class Backpressure:
    """Pause fetching when outstanding work passes a high watermark (requests OR tokens);
    resume once both are at or under the low watermarks.

    Between the two watermarks the state holds, so fetching does not flap on every batch.
    Each call returns what changed, for the caller to pause or resume its partitions.
    """

    def __init__(self, marks: Watermarks) -> None:
        low_requests, low_tokens = marks.low_requests, marks.low_tokens
        assert low_requests is not None and low_tokens is not None  # set by Watermarks
        self.marks = marks
        self._low_requests = low_requests
        self._low_tokens = low_tokens
        self._requests = 0
        self._tokens = 0
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def requests(self) -> int:
        return self._requests

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def room(self) -> int:
        """Requests that may still be admitted before the high watermark is passed (≥ 1)."""
        return max(1, self.marks.high_requests - self._requests + 1)

    def admit(self, requests: int, tokens: int) -> Decision:
        """Add outstanding work."""
        if requests < 0 or tokens < 0:
            raise ValueError(f"cannot admit negative work ({requests} requests, {tokens} tokens)")
        self._requests += requests
        self._tokens += tokens
        return self._decide()

    def release(self, requests: int, tokens: int) -> Decision:
        """Remove finished work; more than is outstanding is a ValueError and changes nothing."""
        if requests < 0 or tokens < 0:
            raise ValueError(f"cannot release negative work ({requests} requests, {tokens} tokens)")
        if requests > self._requests or tokens > self._tokens:
            raise ValueError(
                f"releasing {requests} requests, {tokens} tokens; only {self._requests} "
                f"requests, {self._tokens} tokens are outstanding"
            )
        self._requests -= requests
        self._tokens -= tokens
        return self._decide()

    def _decide(self) -> Decision:
        marks = self.marks
        if not self._paused and (
            self._requests > marks.high_requests or self._tokens > marks.high_tokens
        ):
            self._paused = True
            return Decision.PAUSE
        if (
            self._paused
            and self._requests <= self._low_requests
            and self._tokens <= self._low_tokens
        ):
            self._paused = False
            return Decision.RESUME
        return Decision.NONE
