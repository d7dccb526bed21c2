"""The door: one record in → a request to tokenize, or its refusal sent to the emitter.

    door = Door(config, outcomes, list_topics)
    entry = await door.enter(record, envelope, deaths)   # None: answered here (refused)
    items = await door.tokenized(entries, front)         # a fetch's entries, tokenized

A record's headers are read once, into its `Envelope`, which travels with the request: the
admitted request's content type and trace headers, and every refusal's, come from it. The
checks run in order: quarantined (the crash guard's verdict), unreadable (the Kafka client's),
decoded (`decode_request`), the model-independent rules and deadline (`rules.check`), the
reply topic (`ReplyTopics`). Tokenizing, which needs the model, comes after, for a whole fetch
at once, off the event loop (`rules.tokenize_all`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from actors.config import WorkerConfig
from actors.ingest.envelope import Envelope
from actors.ingest.model_front import EmbedInputs, ModelFront, Tokens
from actors.ingest.refusals import Refusals
from actors.ingest.reply_topics import KnownTopics, ReplyPolicy, ReplyTopics
from actors.ingest.rules import check, check_embed_result_size, tokenize_all
from actors.mail import Admitted, Outcome
from actors.runtime import Address
from messages.embedding import EmbedRequest
from messages.errors import InvalidRequest, UndecodableRequest
from messages.request_decoding import decode_request
from messages.request_kinds import Request, kind_of


@dataclass(frozen=True, slots=True)
class Entry:
    """A record that passed the door: its request, waiting to be tokenized."""

    envelope: Envelope
    request: Request
    content_type: str
    deadline: float | None  # monotonic seconds


class Door:
    def __init__(
        self,
        config: WorkerConfig,
        outcomes: Address[Outcome],
        list_topics: Callable[[], Awaitable[set[str]]],
    ) -> None:
        """`outcomes`: the emitter's mailbox, where refusals go; `list_topics`: the broker's
        topics (for `reply_to`)."""
        self.config = config
        own = (
            config.requests_topic,
            config.dlq_topic,
            config.control_topic,
            config.events_topic,
            config.cancel_topic,
            *config.retry_topics,
        )
        policy = ReplyPolicy.of(
            results_topic=config.results_topic, own_topics=own, allowed=config.allowed_reply_to
        )
        self.reply_topics = ReplyTopics(policy, KnownTopics(list_topics))
        self.refusals = Refusals(config, self.reply_topics, outcomes)

    async def enter(self, record: Any, envelope: Envelope, deaths: int | None) -> Entry | None:
        """One record (a `ConsumerRecord`) at the door: what to tokenize, or None when it was
        answered here. `deaths`: the crash guard's count when the record is quarantined."""
        value: bytes | None = record.value
        if deaths is not None:
            await self.refusals.quarantine(envelope, value, deaths)
            return None
        if envelope.unreadable is not None:
            await self.refusals.unreadable(envelope, value, envelope.unreadable)
            return None
        kind = envelope.kind(value)
        try:
            request = decode_request(
                value,
                envelope.raw_content_type,
                max_bytes=self.config.max_request_bytes,
                key=envelope.record.key,
                kind=kind,
            )
        except UndecodableRequest as exc:
            await self.refusals.reject(envelope, exc, value, kind=kind)
            return None
        try:
            deadline = check(request, envelope.record.timestamp_ms)
            await self.reply_topics.check(request.reply_to)
        except InvalidRequest as exc:
            await self.refusals.reject(envelope, exc, None, request)
            return None
        return Entry(envelope, request, envelope.content_type, deadline)

    async def tokenized(self, entries: list[Entry], front: ModelFront) -> list[Admitted]:
        """The requests that passed the door, tokenized by `front`; the rest refused."""
        if not entries:
            return []
        # Tokenizers release the GIL: a fetched batch tokenizes off the event loop.
        loop = asyncio.get_running_loop()
        requests = [e.request for e in entries]
        tokens = await loop.run_in_executor(None, tokenize_all, front, requests)
        now = time.monotonic()
        admitted = []
        for entry, ids in zip(entries, tokens, strict=True):
            if isinstance(ids, EmbedInputs) and isinstance(entry.request, EmbedRequest):
                ids = self._sized(entry.request, ids, front)
            if isinstance(ids, InvalidRequest):
                await self.refusals.reject(entry.envelope, ids, None, entry.request)
                continue
            try:
                item = self.admitted(entry, ids, front, now)
                item.cost_tokens  # noqa: B018  (a bug here is this record's answer)
            except Exception as exc:  # a bug: this record's answer, not the actor's crash
                await self.refusals.internal_error(entry.envelope, exc, kind_of(entry.request))
                continue
            admitted.append(item)
        return admitted

    def _sized(
        self, request: EmbedRequest, inputs: EmbedInputs, front: ModelFront
    ) -> EmbedInputs | InvalidRequest:
        """`inputs`, or the refusal of a request whose vectors could not fit in one result."""
        width = front.embedding.dimensions if front.embedding is not None else 0
        try:
            check_embed_result_size(
                request, len(inputs.inputs), width, self.config.producer_max_bytes
            )
        except InvalidRequest as exc:
            return exc
        return inputs

    def admitted(self, entry: Entry, tokens: Tokens, front: ModelFront, now: float) -> Admitted:
        """The request, tokenized by `front`, ready for a bucket."""
        embed = tokens if isinstance(tokens, EmbedInputs) else None
        return Admitted(
            request=entry.request,
            record=entry.envelope.record,
            prompt_token_ids=tokens.tokens if isinstance(tokens, EmbedInputs) else tokens,
            reply_topic=entry.request.reply_to or self.config.results_topic,
            content_type=entry.content_type,
            trace=entry.envelope.trace,
            consumed_at=now,
            deadline=entry.deadline,
            model_digest=front.digest,
            attempts=entry.envelope.attempts,
            embed=embed,
        )
