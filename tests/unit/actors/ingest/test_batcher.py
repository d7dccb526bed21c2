"""Batcher alone: a full bucket leaves at once; a cancel takes its request out of a bucket
(answered cancelled, the cancel passed on marked answered); a cancel for a request still
arriving waits until it is bucketed."""

from __future__ import annotations

import asyncio
import time

from actors.ingest.batcher import Batcher
from actors.ingest.buckets import BucketConfig
from actors.mail import Admitted, Batch, Cancel, Outcome, RecordRef
from actors.runtime import Mailbox
from actors.telemetry.trace_context import TraceContext
from messages.codec import JSON
from messages.request import GenerateRequest
from messages.result import FinishReason, ModelRef

WITHIN_S = 60  # only to catch a hang: every wait ends on an event
HOUR = 3600.0  # no bucket leaves by waiting in these tests


def item(request_id: str, offset: int = 0) -> Admitted:
    return Admitted(
        request=GenerateRequest(id=request_id, prompt_token_ids=[3, 4], max_new_tokens=2),
        record=RecordRef("lane.requests", 0, offset, 0),
        prompt_token_ids=[3, 4], reply_topic="lane.results", content_type=JSON,
        trace=TraceContext(), consumed_at=time.monotonic(), deadline=None,
    )  # fmt: skip


def batcher(max_batch_size: int = 8) -> tuple[Batcher, Mailbox[Batch | Cancel], Mailbox[Outcome]]:
    batches: Mailbox[Batch | Cancel] = Mailbox(16)
    outcomes: Mailbox[Outcome] = Mailbox(16)
    config = BucketConfig((32,), max_batch_tokens=1000, max_batch_size=max_batch_size,
                          max_wait_s=HOUR)  # fmt: skip
    model = ModelRef(name="m", digest="d")
    made = Batcher(config, batches=batches, outcomes=outcomes, model=lambda: model, worker="w",
                   stopping=asyncio.Event())  # fmt: skip
    return made, batches, outcomes


async def test_a_full_bucket_leaves_as_one_batch() -> None:
    b, batches, _ = batcher(max_batch_size=2)
    await b.add(item("a"), 2)
    assert batches.empty() and len(b) == 1
    await b.add(item("b"), 2)
    batch = batches.get_nowait()
    assert isinstance(batch, Batch) and batch.reason == "size"
    assert [i.request.id for i in batch.items] == ["a", "b"] and len(b) == 0


async def test_a_cancel_takes_its_request_out_of_a_bucket() -> None:
    b, batches, outcomes = batcher()
    await b.add(item("a"), 2)
    await b.add(item("b", offset=1), 2)
    async with asyncio.timeout(WITHIN_S):
        cancelling = asyncio.create_task(b.cancel_loop())
        await b.cancels.send(Cancel("a", reason="user"))
        assert await batches.get() == Cancel("a", reason="user", answered=True)
        outcome = await outcomes.get()
        cancelling.cancel()
    assert outcome.result.finish_reason == FinishReason.CANCELLED
    assert outcome.cancelled_in == "bucket" and outcome.result.id == "a"
    await b.drain()
    (left,) = [batches.get_nowait()]
    assert isinstance(left, Batch) and [i.request.id for i in left.items] == ["b"]


async def test_a_cancel_for_a_request_still_arriving_waits_until_it_is_bucketed() -> None:
    b, batches, outcomes = batcher()
    async with asyncio.timeout(WITHIN_S):
        with b.arriving() as arriving:
            arriving.add("a")
            await b.cancels.send(Cancel("a"))
            cancelling = asyncio.create_task(b.cancel_loop())
            await asyncio.sleep(0)  # the loop takes the cancel, and waits
            assert batches.empty()
            await b.add(item("a"), 2)
        # Applied early, the cancel would have passed on unanswered, "a" cancelled on arrival.
        assert await batches.get() == Cancel("a", answered=True)
        assert (await outcomes.get()).cancelled_in == "bucket"
        cancelling.cancel()
