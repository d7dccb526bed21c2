"""Length buckets: group requests of similar prompt length into batches. Pure Python, no I/O.

A request goes to the smallest bucket whose upper bound holds its prompt, so a batch pads
little. A bucket is flushed as one batch when it is full (tokens or size) or when its oldest
request has waited `max_wait_s`; the caller asks for due buckets at `next_deadline()`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Generic, TypeVar

from actors.mail import FlushReason

__all__ = ["BucketConfig", "FlushReason", "Flushed", "LengthBuckets", "default_boundaries"]

T = TypeVar("T")


@dataclass(frozen=True)
class BucketConfig:
    """The buckets' shape; the worker's come from `WorkerConfig.bucket_config`, which holds
    the defaults."""

    boundaries: tuple[int, ...]  # ascending upper bounds of prompt length, in tokens
    max_batch_tokens: int
    max_batch_size: int
    max_wait_s: float

    def __post_init__(self) -> None:
        if not self.boundaries:
            raise ValueError("bucket boundaries must not be empty")
        if self.boundaries[0] <= 0:
            raise ValueError(f"bucket boundaries must be positive, got {self.boundaries}")
        if any(a >= b for a, b in pairwise(self.boundaries)):
            raise ValueError(f"bucket boundaries must be strictly ascending, got {self.boundaries}")
        if self.max_batch_tokens <= 0 or self.max_batch_size <= 0:
            raise ValueError("max_batch_tokens and max_batch_size must be positive")
        if self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must not be negative, got {self.max_wait_s}")


def default_boundaries(max_model_len: int) -> tuple[int, ...]:
    """Powers of two from 32, ending exactly at `max_model_len`: 100 -> (32, 64, 100)."""
    if max_model_len <= 0:
        raise ValueError(f"max_model_len must be positive, got {max_model_len}")
    bounds: list[int] = []
    bound = 32
    while bound < max_model_len:
        bounds.append(bound)
        bound *= 2
    return (*bounds, max_model_len)


@dataclass(frozen=True)
class Flushed(Generic[T]):
    """One batch out of a bucket: its items in arrival order, and why it left."""

    bucket: int  # the bucket's upper bound
    items: list[T]
    tokens: int
    reason: FlushReason
    oldest_wait_s: float


@dataclass
class _Bucket(Generic[T]):
    bound: int
    items: list[T] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each item's tokens, in step with items
    tokens: int = 0
    since: float = 0.0  # arrival of the oldest item; meaningful only while items is non-empty


class LengthBuckets(Generic[T]):
    """Requests held by prompt length until their bucket fills or waits long enough.

    A batch never holds more than `max_batch_size` items, nor more than `max_batch_tokens`
    tokens unless it is a single item (a prompt longer than that leaves alone). Items keep
    their arrival order within a bucket; a prompt longer than the last boundary goes to the
    last bucket. Every item added comes out exactly once, from `add()`, `due()` or `drain()`.
    """

    def __init__(self, config: BucketConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._buckets: list[_Bucket[T]] = [_Bucket(bound) for bound in config.boundaries]
        self._count = 0
        self._tokens = 0

    def __len__(self) -> int:
        return self._count

    @property
    def tokens(self) -> int:
        return self._tokens

    def add(self, item: T, num_tokens: int) -> list[Flushed[T]]:
        """Place `item` in its bucket; returns the batches that became full."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must not be negative, got {num_tokens}")
        now = self._clock()
        index = min(bisect_left(self.config.boundaries, num_tokens), len(self._buckets) - 1)
        bucket = self._buckets[index]
        flushed: list[Flushed[T]] = []
        if bucket.items and bucket.tokens + num_tokens > self.config.max_batch_tokens:
            flushed.append(self._flush(bucket, "tokens", now))
        if not bucket.items:
            bucket.since = now
        bucket.items.append(item)
        bucket.sizes.append(num_tokens)
        bucket.tokens += num_tokens
        self._count += 1
        self._tokens += num_tokens
        if bucket.tokens >= self.config.max_batch_tokens:
            flushed.append(self._flush(bucket, "tokens", now))
        elif len(bucket.items) >= self.config.max_batch_size:
            flushed.append(self._flush(bucket, "size", now))
        return flushed

    def remove(self, match: Callable[[T], bool]) -> list[T]:
        """Take out every held item `match` accepts (a cancelled request); returns them.

        A bucket that keeps items keeps its `since` too: it is flushed no later than before."""
        removed: list[T] = []
        for bucket in self._buckets:
            items: list[T] = []
            sizes: list[int] = []
            for item, num_tokens in zip(bucket.items, bucket.sizes, strict=True):
                if match(item):
                    removed.append(item)
                    self._count -= 1
                    self._tokens -= num_tokens
                    bucket.tokens -= num_tokens
                else:
                    items.append(item)
                    sizes.append(num_tokens)
            bucket.items, bucket.sizes = items, sizes
        return removed

    def due(self) -> list[Flushed[T]]:
        """Buckets whose oldest item has waited `max_wait_s`, oldest first."""
        now = self._clock()
        ready = [b for b in self._held() if now >= b.since + self.config.max_wait_s]
        return [self._flush(bucket, "wait", now) for bucket in ready]

    def next_deadline(self) -> float | None:
        """Clock time at which the next bucket becomes due; None when nothing is held."""
        held = self._held()
        return held[0].since + self.config.max_wait_s if held else None

    def drain(self, reason: FlushReason = "drain") -> list[Flushed[T]]:
        """Everything held, oldest bucket first."""
        now = self._clock()
        return [self._flush(bucket, reason, now) for bucket in self._held()]

    def _held(self) -> list[_Bucket[T]]:
        return sorted((b for b in self._buckets if b.items), key=lambda b: b.since)

    def _flush(self, bucket: _Bucket[T], reason: FlushReason, now: float) -> Flushed[T]:
        batch = Flushed(bucket.bound, bucket.items, bucket.tokens, reason, now - bucket.since)
        self._count -= len(bucket.items)
        self._tokens -= bucket.tokens
        bucket.items = []
        bucket.sizes = []
        bucket.tokens = 0
        return batch
