"""Streamed chunks are kept per request until its outcome is delivered, then only its own are
forgotten."""

from __future__ import annotations

from actors.emit.chunks import ChunkLedger
from actors.mail import Outcome, RecordRef, StreamChunk
from messages import headers as h
from messages.chunk import GenerateChunk
from messages.codec import JSON, MSGPACK, Codec
from messages.result import GenerateResult


def chunk(request_id: str, seq: int, topic: str = "lane.replies") -> StreamChunk:
    return StreamChunk(GenerateChunk(id=request_id, seq=seq, text=f"t{seq}"), topic, MSGPACK)


def outcome(request_id: str, topic: str = "lane.replies") -> Outcome:
    return Outcome(RecordRef("lane.requests", 0, 1, 0), GenerateResult(id=request_id), topic, JSON)


def test_a_chunk_is_a_record_on_its_results_topic_and_key() -> None:
    ledger = ChunkLedger()
    sent = ledger.record(chunk("r-1", 0))
    record = sent.record
    assert (record.topic, record.key, record.is_result) == ("lane.replies", b"r-1", False)
    assert dict(record.headers)[h.SCHEMA] == h.CHUNK_SCHEMA.encode()
    assert dict(record.headers)[h.CONTENT_TYPE] == MSGPACK.encode()
    assert Codec(GenerateChunk).decode(record.value, MSGPACK).text == "t0"
    assert (sent.ack, sent.confirmed) == (None, False)
    assert ledger.kept() == [sent]


def test_an_outcome_waits_for_its_requests_chunks_on_its_reply_topic_only() -> None:
    ledger = ChunkLedger()
    first, second = ledger.record(chunk("r-1", 0)), ledger.record(chunk("r-1", 1))
    elsewhere = ledger.record(chunk("r-1", 0, topic="other.replies"))
    ledger.record(chunk("r-2", 0))
    assert ledger.of(outcome("r-1")) == [first, second]
    assert ledger.of(outcome("r-1", topic="other.replies")) == [elsewhere]
    assert ledger.of(outcome("r-3")) == []


def test_forgetting_a_delivered_outcomes_chunks_keeps_the_rest() -> None:
    ledger = ChunkLedger()
    mine = [ledger.record(chunk("r-1", 0)), ledger.record(chunk("r-1", 1))]
    theirs = ledger.record(chunk("r-1", 0, topic="other.replies"))
    other = ledger.record(chunk("r-2", 0))
    ledger.forget("r-1", mine)
    assert ledger.kept() == [theirs, other]
    ledger.forget("r-1", [theirs])
    ledger.forget("r-3", [])  # nothing kept for it: nothing to do
    assert ledger.kept() == [other]
