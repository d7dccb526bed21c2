"""The ids of recent cancels, for requests still on the requests topic when their cancel came.

A cancel can arrive before any worker has fetched its request (a backlog, a paused
partition). Every worker reads every cancel, so each remembers the id for a while; the worker
that later consumes the request answers it cancelled at once instead of running it. Bounded
both ways: at most `capacity` ids (the oldest forgotten first), each for `ttl_s` seconds.
Pure (no I/O); the clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

REMEMBER_S = 600.0  # how long a cancel holds for a request not seen yet


class RecentCancels:
    def __init__(
        self,
        capacity: int = 65_536,
        ttl_s: float = REMEMBER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity <= 0 or ttl_s <= 0:
            raise ValueError("capacity and ttl_s must be positive")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()  # id -> when it is forgotten

    def __len__(self) -> int:
        self._expire()
        return len(self._until)

    def add(self, request_id: str) -> None:
        self._until.pop(request_id, None)
        self._until[request_id] = self.clock() + self.ttl_s
        while len(self._until) > self.capacity:
            self._until.popitem(last=False)

    def __contains__(self, request_id: object) -> bool:
        self._expire()
        return request_id in self._until

    def _expire(self) -> None:
        now = self.clock()
        while self._until:
            oldest, until = next(iter(self._until.items()))
            if until > now:
                return
            del self._until[oldest]
