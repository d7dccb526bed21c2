"""The ids of recent cancels, for requests still on the requests topic when their cancel came.

A cancel can arrive before any worker has fetched its request (a backlog, a paused
partition). Every worker reads every cancel, so each remembers the id for a while; the worker
that later consumes the request answers it cancelled at once instead of running it. Bounded
three ways: at most `capacity` ids and at most `max_bytes` of them (UTF-8), the oldest
forgotten first, each for `ttl_s` seconds. So a flood of cancels (anyone who may write the
cancel topic can send one) costs a worker a known amount of memory, whatever the ids.
Pure (no I/O); the clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

REMEMBER_S = 600.0  # how long a cancel holds for a request not seen yet
MAX_REMEMBERED = 65_536  # ids
MAX_REMEMBERED_BYTES = 8 << 20  # the ids' UTF-8 bytes together


class RecentCancels:
    def __init__(
        self,
        capacity: int = MAX_REMEMBERED,
        ttl_s: float = REMEMBER_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_bytes: int = MAX_REMEMBERED_BYTES,
    ) -> None:
        if capacity <= 0 or ttl_s <= 0 or max_bytes <= 0:
            raise ValueError("capacity, ttl_s and max_bytes must be positive")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()  # id -> when it is forgotten
        self._bytes = 0  # of the ids in `_until`

    def __len__(self) -> int:
        self._expire()
        return len(self._until)

    @property
    def bytes(self) -> int:
        """The UTF-8 bytes of the ids remembered now."""
        self._expire()
        return self._bytes

    def add(self, request_id: str) -> None:
        """Remember `request_id` (again: its time starts over). An id longer than `max_bytes`
        on its own is not remembered."""
        size = _size(request_id)
        self._forget(request_id)
        if size > self.max_bytes:
            return
        self._until[request_id] = self.clock() + self.ttl_s
        self._bytes += size
        while len(self._until) > self.capacity or self._bytes > self.max_bytes:
            self._forget(next(iter(self._until)))

    def __contains__(self, request_id: object) -> bool:
        self._expire()
        return request_id in self._until

    def _forget(self, request_id: str) -> None:
        if self._until.pop(request_id, None) is not None:
            self._bytes -= _size(request_id)

    def _expire(self) -> None:
        now = self.clock()
        while self._until:
            oldest, until = next(iter(self._until.items()))
            if until > now:
                return
            self._forget(oldest)


def _size(request_id: str) -> int:
    return len(request_id.encode(errors="replace"))
