"""What `Gateway.stream` comes back with: a refusal to answer as JSON, or a stream begun."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refused:
    """The worker refused the request before its first token: `status` and OpenAI's error
    `body`, answered as JSON (not a stream)."""

    status: int
    body: Any


@dataclass(frozen=True)
class Streaming:
    """The stream's `first` SSE event and the rest (`events`), which own the request from
    now on: they release its place and cancel it when not read to the end."""

    first: bytes
    events: AsyncIterator[bytes]
