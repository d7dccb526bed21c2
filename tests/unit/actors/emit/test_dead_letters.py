"""Dead letters: one the DLQ refuses is trimmed to tokenmill's own headers."""

from __future__ import annotations

from aiokafka.errors import MessageSizeTooLargeError

from actors.emit.dead_letters import trimmed_dead_letter
from actors.emit.records import Record
from actors.mail import RecordRef
from actors.results import rejected_at_door
from actors.telemetry.trace_context import TraceContext
from messages import headers as h
from messages.codec import JSON
from messages.error_codes import ErrorCode

RECORD = RecordRef("tokenmill.requests", 3, 1041, timestamp_ms=1_767_225_600_000, key=b"k-1")


def dead_letter_record(code: ErrorCode, headers: list[tuple[str, bytes]]) -> Record:
    outcome = rejected_at_door(
        RECORD,
        code,
        "why it was refused",
        request_id="req-1",
        reply_topic="tokenmill.results",
        content_type=JSON,
        worker="w1",
        value=b"{x" * 1000,
        headers=headers,
        trace=TraceContext.of(headers),
    )
    letter = outcome.dead_letter
    assert letter is not None
    return Record("tokenmill.dlq", letter.value or b"", letter.key, letter.headers, "dead_letter")


def test_atrimmed_dead_letter_keeps_tokenmills_and_connects_headers_only() -> None:
    originals = [
        ("x-team", b"search"),
        ("x-blob", b"b" * 30_000),
        # From an earlier trip through a DLQ: ours come later, and win.
        (h.CONNECT_STAGE, b"TRANSFORMATION"),
        (h.DLQ_ERROR_CODE, b"engine_error"),
        (h.DLQ_CRASHES, b"3"),
    ]
    record = dead_letter_record(ErrorCode.QUARANTINED, originals)
    trimmed = trimmed_dead_letter(record, MessageSizeTooLargeError())
    assert trimmed is not None
    assert (trimmed.value, trimmed.key, trimmed.is_result) == (b"", b"k-1", False)
    names = [name for name, _ in trimmed.headers]
    assert len(names) == len(set(names)), "each once"
    assert set(names) <= h.DEAD_LETTER_HEADERS
    kept = dict(trimmed.headers)
    assert kept[h.DLQ_ERROR_CODE] == b"quarantined"
    assert kept[h.DLQ_CRASHES] == b"3"
    assert kept[h.CONNECT_STAGE] == b"TASK_PUT"
    assert kept[h.CONNECT_EXCEPTION] == b"tokenmill.errors.Quarantined"
    assert kept[h.CONNECT_EXCEPTION_MESSAGE] == b"why it was refused"
    assert (kept[h.CONNECT_TOPIC], kept[h.CONNECT_PARTITION], kept[h.CONNECT_OFFSET]) == (
        b"tokenmill.requests",
        b"3",
        b"1041",
    )
    assert (kept[h.CONNECT_CONNECTOR_NAME], kept[h.CONNECT_TASK_ID]) == (b"tokenmill", b"w1")
    assert trimmed.size < 4096, "far within what any DLQ topic takes"
    # Refused again as it is: nothing left to trim, it waits for the DLQ (EmitterActor._unblock).
    assert trimmed_dead_letter(trimmed, MessageSizeTooLargeError()) is None


def test_a_dead_letter_with_only_its_own_headers_is_trimmed_of_its_value() -> None:
    record = dead_letter_record(ErrorCode.INVALID_JSON, [])
    trimmed = trimmed_dead_letter(record, MessageSizeTooLargeError())
    assert trimmed is not None and trimmed.value == b""
    assert list(trimmed.headers) == list(record.headers)
    assert trimmed_dead_letter(trimmed, MessageSizeTooLargeError()) is None
