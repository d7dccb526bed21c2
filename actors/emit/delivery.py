"""Waiting for the broker's acknowledgements, and what each failed send becomes.

A send that fails because the broker is away is sent again, with backoff, for as long as it
takes; a result the broker refuses for good is answered instead; a dead letter it refuses is
trimmed, then left blocked (for the emitter to send again until the DLQ takes it); a retry it
refuses is dead-lettered instead (with the request's error result); a chunk it refuses is
dropped. A producer that is itself broken raises `ProducerBroken`.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

import structlog
from aiokafka.errors import KafkaError

from actors.config import WorkerConfig
from actors.emit.dead_letters import trimmed_dead_letter
from actors.emit.destinations import Destinations
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending, SentChunk
from actors.emit.vanished import TopicVanished
from actors.send_errors import ProducerBroken, Verdict, backoff_s, refusal_code, verdict

log = structlog.get_logger("tokenmill.emitter")


class Settled(enum.Enum):
    DONE = "done"  # every record acknowledged, or answered instead
    BLOCKED = "blocked"  # its dead letter refused even trimmed (`p.blocked` says which)
    WAITS = "waits"  # a record sent again waits for its topic: settle it apart (`apart=True`)


class Delivery:
    """Settles an outcome's records (and its chunks) with the broker.

    `count(action)` is told of each retried send; `chunk_confirmed()` of each chunk
    acknowledged."""

    def __init__(
        self,
        planner: OutcomePlanner,
        *,
        count: Callable[[str], None],
        chunk_confirmed: Callable[[], None],
    ) -> None:
        self.planner = planner
        self.count = count
        self.chunk_confirmed = chunk_confirmed

    async def settle(
        self, out: Destinations, p: Pending, config: WorkerConfig, *, apart: bool = False
    ) -> Settled:
        """Return DONE once every record of `p` (and every chunk before it) is acknowledged,
        or answered instead; BLOCKED when its dead letter is refused even trimmed. With
        `apart`, WAITS as soon as a record sent again waits for its topic (its topic was
        deleted meanwhile, say), so that the caller settles it apart from the others."""
        for sent in p.chunks:
            await self.settle_chunk(out, sent, apart=apart)
            if apart and sent.ack is not None and out.waiting(sent.ack):
                return Settled.WAITS
        i, attempt = 0, 0
        while i < len(p.records):
            record = p.records[i]
            try:
                await p.acks[i]
                i += 1
                continue
            except KafkaError as exc:
                failure = exc
            judged = verdict(failure)
            if judged is Verdict.BROKEN:
                # Its sequence numbers lost after an outage, say: a new producer sends again
                # what this one left unconfirmed (duplicates possible, nothing lost).
                raise ProducerBroken(repr(failure)) from failure
            if judged is Verdict.REFUSED and record.is_result and p.answered is None:
                # A dead letter it already had is kept, and not sent a second time.
                letter_acks = p.acks[1:]
                message = f"{record.topic}: {failure!r}"
                self.planner.answer_instead(p, refusal_code(failure), message, config)
                self.planner.plan(p, config)
                p.acks = [await out.send(p.records[0])]
                p.acks += letter_acks or [await out.send(r) for r in p.records[1:]]
                i = 0
                continue
            if judged is Verdict.REFUSED and record.is_retry:
                # Nothing of it was written: its request is dead-lettered and answered now.
                self.planner.retry_refused(p, failure, config)
                p.acks = [await out.send(r) for r in p.records]
                i = 0
                continue
            if judged is Verdict.REFUSED and record.is_dead_letter:
                trimmed = trimmed_dead_letter(record, failure)
                if trimmed is None:  # refused as small as it gets: it waits for the DLQ
                    p.blocked, p.refusal = i, failure
                    return Settled.BLOCKED
                p.records[i] = trimmed
                p.acks[i] = await out.send(trimmed)
                continue
            if judged is Verdict.REFUSED:
                # Even the small error result is refused: the results topic is misconfigured
                # (or not writable); wait for an operator rather than lose the answer.
                log.error("results_topic_refused", topic=record.topic, error=repr(failure))
            delay = _backoff_s(failure, attempt)
            attempt += 1
            self.count("retried")
            log.warning("send_retrying", topic=record.topic, error=repr(failure), retry_in_s=delay)
            await asyncio.sleep(delay)
            p.acks[i] = await out.send(record)
            if apart and out.waiting(p.acks[i]):
                return Settled.WAITS
        return Settled.DONE

    async def settle_chunk(
        self, out: Destinations, sent: SentChunk, *, apart: bool = False
    ) -> None:
        """Return once `sent` is acknowledged, or refused for good (then it is dropped); with
        `apart`, also once it is sent again to wait for its topic (`out.waiting(sent.ack)`)."""
        attempt = 0
        while True:
            if sent.confirmed:
                return
            if sent.ack is None:
                sent.ack = await out.send(sent.record)
            try:
                await sent.ack
                sent.confirmed = True
                self.chunk_confirmed()
                return
            except KafkaError as exc:
                failure = exc
            judged = verdict(failure)
            if judged is Verdict.BROKEN:
                raise ProducerBroken(repr(failure)) from failure
            if judged is Verdict.REFUSED:
                log.warning("chunk_refused", topic=sent.record.topic, error=repr(failure))
                sent.confirmed = True  # nothing more to do for it
                return
            delay = _backoff_s(failure, attempt)
            attempt += 1
            self.count("retried")
            log.warning("send_retrying", topic=sent.record.topic, error=repr(failure))
            await asyncio.sleep(delay)
            sent.ack = await out.send(sent.record)
            if apart and out.waiting(sent.ack):
                return


def _backoff_s(failure: KafkaError, attempt: int) -> float:
    """How long a send waits before it is made again: none when its topic vanished (sent again,
    it waits apart for its topic, which is the wait); else backoff, the broker being away."""
    return 0.0 if isinstance(failure, TopicVanished) else backoff_s(attempt)
