"""Streamed requests' chunks, kept from their production until their request is delivered."""

from __future__ import annotations

from actors.emit.records import Record, SentChunk
from actors.mail import Outcome, StreamChunk
from messages import headers as h
from messages.chunk import GenerateChunk
from messages.codec import Codec

_CHUNK_SCHEMA = h.CHUNK_SCHEMA.encode()


class ChunkLedger:
    """Chunks by request id, from their production until their request's outcome is delivered
    (its offset may then be committed): a replaced producer sends again those not
    acknowledged."""

    def __init__(self) -> None:
        self.codec = Codec(GenerateChunk)
        self._chunks: dict[str, list[SentChunk]] = {}

    def record(self, message: StreamChunk) -> SentChunk:
        """`message` as a record on its result's topic and key, kept until its outcome is in."""
        chunk = message.chunk
        key = chunk.id.encode()
        headers = [
            *message.trace.headers,
            (h.CONTENT_TYPE, message.content_type.encode()),
            (h.SCHEMA, _CHUNK_SCHEMA),
        ]
        value = self.codec.encode(chunk, message.content_type)
        record = Record(message.reply_topic, value, key, headers, "chunk")
        sent = SentChunk(record)
        self._chunks.setdefault(chunk.id, []).append(sent)
        return sent

    def kept(self) -> list[SentChunk]:
        """Every chunk kept, in the order produced per request."""
        return [sent for chunks in self._chunks.values() for sent in chunks]

    def of(self, outcome: Outcome) -> list[SentChunk]:
        """The chunks `outcome`'s request made: those for its reply topic (another request
        under the same id, answered `duplicate_request` elsewhere, has none of them)."""
        kept = self._chunks.get(outcome.result.id, ())
        return [sent for sent in kept if sent.record.topic == outcome.reply_topic]

    def forget(self, request_id: str, done: list[SentChunk]) -> None:
        """Drop `done`, the chunks a delivered outcome waited for (only those: another
        request's under the same id, one refused as a duplicate while this one streams, stay
        kept)."""
        kept = self._chunks.get(request_id)
        if kept is None:
            return
        mine = {id(sent) for sent in done}
        if left := [sent for sent in kept if id(sent) not in mine]:
            self._chunks[request_id] = left
        else:
            del self._chunks[request_id]
