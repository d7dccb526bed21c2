"""How often a streamed request's chunks are sent: its own intervals, bounded by the worker's."""

from __future__ import annotations

from dataclasses import dataclass

from messages.request import GenerateRequest


@dataclass(frozen=True)
class StreamPolicy:
    """The worker's streaming settings.

    `interval_tokens` / `interval_ms`: the defaults for a request that names none (a chunk is
    due after that many new tokens or that long since the previous chunk, whichever first).
    `min_interval_ms`: the floor: no two chunks of one request closer than this, whatever
    the request asks, so one request cannot make the worker send a record per token.
    """

    interval_tokens: int = 16
    interval_ms: float = 200.0
    min_interval_ms: float = 20.0

    def __post_init__(self) -> None:
        if self.interval_tokens < 1:
            raise ValueError(f"stream interval_tokens must be ≥ 1, got {self.interval_tokens}")
        if self.interval_ms < 0 or self.min_interval_ms < 0:
            raise ValueError("stream intervals must be ≥ 0 ms")

    def intervals(self, request: GenerateRequest) -> tuple[int, float, float]:
        """`request`'s (tokens, seconds, floor in seconds) between chunks."""
        tokens = request.stream_interval_tokens or self.interval_tokens
        ms = request.stream_interval_ms
        ms = self.interval_ms if ms is None else ms
        return tokens, ms / 1000, self.min_interval_ms / 1000
