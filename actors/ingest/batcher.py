"""The batcher: admitted requests into length buckets, buckets out as `Batch`es, and cancels.

    await batcher.add(item, prompt_tokens)   # a full bucket leaves at once
    await batcher.flush_loop()               # a bucket leaves when its oldest has waited enough
    await batcher.cancel_loop()              # `Cancel`s from the cancel actor
    await batcher.drain("idle")              # everything held leaves now

Batches go to the GPU actor's mailbox; a cancel goes there too, behind the batches already
handed over: batches are handed over, and cancels passed on, one at a time (`_handover`), so a
cancel never overtakes the batch that holds its request. A cancelled request still in a bucket
is answered here (cancelled, no tokens), and the cancel passed on marked `answered`. Every
cancel's id is remembered a while (`RecentCancels`): a request that arrives after its cancel
is answered cancelled at once (`cancelled_on_arrival`). A cancel for a request read but not
yet bucketed (`arriving`) waits until it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import structlog

from actors.cancel.remembered import RecentCancels
from actors.ingest.buckets import BucketConfig, Flushed, LengthBuckets
from actors.mail import Admitted, Batch, Cancel, CancelledIn, FlushReason, Outcome
from actors.results import cancelled_before_engine
from actors.runtime import Address, Mailbox
from actors.telemetry.metrics import WorkerMetrics
from messages.result import ModelRef

log = structlog.get_logger("tokenmill.ingest")


class Batcher:
    def __init__(
        self,
        config: BucketConfig,
        *,
        batches: Address[Batch | Cancel],
        outcomes: Address[Outcome],
        model: Callable[[], ModelRef],
        worker: str,
        stopping: asyncio.Event,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """`batches`: the GPU actor's mailbox; `outcomes`: the emitter's (requests cancelled
        here); `model`: the model the ingest tokenizes with now (named in those answers)."""
        self.buckets: LengthBuckets[Admitted] = LengthBuckets(config)
        self.batches = batches
        self.outcomes = outcomes
        self.model = model
        self.worker = worker
        self.stopping = stopping
        self.metrics = metrics
        self.cancels: Mailbox[Cancel] = Mailbox(256)  # the cancel actor's address
        self.recent_cancels = RecentCancels()  # for requests that arrive after their cancel
        self._arriving: set[str] = set()  # ids read, not yet in a bucket
        self._bucketed = asyncio.Event()
        self._added = asyncio.Event()
        self._handover = asyncio.Lock()

    def __len__(self) -> int:
        return len(self.buckets)

    # -- batches ---------------------------------------------------------------------------

    async def add(self, item: Admitted, prompt_tokens: int) -> None:
        """Into its bucket, unless its cancel came first (then answered at once)."""
        if item.request.id in self.recent_cancels:
            await self._cancelled(item, "arrival")
            return
        await self.flush(self.buckets.add(item, prompt_tokens))
        self._added.set()

    async def drain(self, reason: FlushReason = "drain") -> None:
        await self.flush(self.buckets.drain(reason))

    def wake(self) -> None:
        """Wake the flush loop (to see `stopping`)."""
        self._added.set()

    async def flush(self, flushed: Iterable[Flushed[Admitted]]) -> None:
        async with self._handover:  # taken before yielding: no cancel passes these batches
            for f in flushed:
                if self.metrics is not None:
                    self.metrics.observe_batch(len(f.items), f.tokens, f.reason)
                log.debug("batch_flushed", bucket=f.bucket, size=len(f.items), tokens=f.tokens,
                          reason=f.reason,
                          oldest_wait_ms=round(f.oldest_wait_s * 1000, 2))  # fmt: skip
                await self.batches.send(
                    Batch(bucket=f.bucket, items=f.items, tokens=f.tokens, reason=f.reason)
                )

    async def flush_loop(self) -> None:
        """Until `stopping`: each bucket leaves once its oldest request has waited enough."""
        while not self.stopping.is_set():
            deadline = self.buckets.next_deadline()
            self._added.clear()
            if deadline is None:
                await self._added.wait()
                continue
            delay = deadline - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._added.wait(), delay)
            await self.flush(self.buckets.due())

    # -- cancels ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def arriving(self) -> Iterator[set[str]]:
        """While a fetch's requests are between the door and their buckets: a cancel for one
        of the ids added to the set yielded waits until they are bucketed."""
        try:
            yield self._arriving
        finally:
            self._arriving.clear()
            self._bucketed.set()

    async def cancel_loop(self) -> None:
        while True:
            cancel = await self.cancels.get()
            while cancel.request_id in self._arriving:  # read, not yet in a bucket
                self._bucketed.clear()
                await self._bucketed.wait()
            async with self._handover:
                await self._cancel(cancel)

    async def _cancel(self, cancel: Cancel) -> None:
        """Answer a cancelled request held in a bucket, and pass the cancel on (the GPU actor
        may hold it, or a copy of it: a redelivery)."""
        request_id = cancel.request_id
        self.recent_cancels.add(request_id)
        taken = self.buckets.remove(lambda item: item.request.id == request_id)
        await self.batches.send(replace(cancel, answered=True) if taken else cancel)
        if not taken:
            return
        log.info("request_cancelled", request_id=request_id, where="bucket", reason=cancel.reason)
        if self.metrics is not None:
            self.metrics.observe_cancel("bucket")
        model = self.model()
        for item in taken:
            outcome = cancelled_before_engine(item, model=model, worker=self.worker, where="bucket")
            await self.outcomes.send(outcome)

    async def _cancelled(self, item: Admitted, where: CancelledIn) -> None:
        log.info("request_cancelled", request_id=item.request.id, where=where)
        if self.metrics is not None:
            self.metrics.observe_cancel(where)
        await self.outcomes.send(
            cancelled_before_engine(item, model=self.model(), worker=self.worker, where=where)
        )
