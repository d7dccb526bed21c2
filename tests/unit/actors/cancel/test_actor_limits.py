"""Cancels are cheap to hold: a record over MAX_CANCEL_BYTES or with an id longer than a request
id can be is refused, counted and logged; the ids remembered are bounded in bytes too."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import ConsumerRecord
from structlog.testing import capture_logs

from actors.cancel.actor import CancelActor, Refused, decode_cancel
from actors.cancel.remembered import RecentCancels
from actors.config import WorkerConfig
from actors.mail import Cancel
from actors.runtime import Mailbox
from messages.cancel import MAX_CANCEL_BYTES, CancelRequest, cancel_codec
from messages.limits import MAX_ID_BYTES
from tests.unit.gpu.test_scheduler import FakeClock


def test_a_cancel_record_over_the_limit_is_refused_unread() -> None:
    value = b'{"id": "a", "reason": "' + b"x" * MAX_CANCEL_BYTES + b'"}'
    refused = decode_cancel(value, None)
    assert isinstance(refused, Refused) and refused.reason == "too_large"
    assert str(len(value)) in refused.detail


def test_a_cancel_at_the_limit_is_read() -> None:
    value = cancel_codec.encode(CancelRequest(id="a", reason="r"))
    value = value[:-1] + b" " * (MAX_CANCEL_BYTES - len(value)) + b"}"
    assert len(value) == MAX_CANCEL_BYTES
    assert decode_cancel(value, None) == CancelRequest(id="a", reason="r")


@pytest.mark.parametrize(
    "request_id, refused",
    [
        ("a" * MAX_ID_BYTES, False),
        ("a" * (MAX_ID_BYTES + 1), True),
        ("é" * (MAX_ID_BYTES // 2), False),  # two bytes each: counted in UTF-8 bytes
        ("é" * (MAX_ID_BYTES // 2 + 1), True),
    ],
)
def test_an_id_longer_than_a_request_id_can_be_is_refused(request_id: str, refused: bool) -> None:
    decoded = decode_cancel(cancel_codec.encode(CancelRequest(id=request_id)), None)
    if refused:
        assert isinstance(decoded, Refused) and decoded.reason == "id_too_long"
    else:
        assert decoded == CancelRequest(id=request_id)


def _record(value: bytes, offset: int = 0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="lane.cancel", partition=0, offset=offset, timestamp=0, timestamp_type=0,
        key=None, value=value, checksum=None, serialized_key_size=-1,
        serialized_value_size=len(value), headers=[],
    )  # fmt: skip


def test_the_actor_counts_each_refusal_by_reason_and_hands_on_the_rest() -> None:
    cancels: Mailbox[Cancel] = Mailbox(8)
    actor = CancelActor(WorkerConfig(cancel_topic="lane.cancel"), cancels)
    records = [
        _record(b"x" * (MAX_CANCEL_BYTES + 1), 0),
        _record(cancel_codec.encode(CancelRequest(id="a" * (MAX_ID_BYTES + 1))), 1),
        _record(b"not json", 2),
        _record(cancel_codec.encode(CancelRequest(id="job-1", reason="user")), 3),
    ]

    async def main() -> None:
        for record in records:
            await actor._handle(record)

    with capture_logs() as logs:
        asyncio.run(main())
    assert actor.refused == {"too_large": 1, "id_too_long": 1, "malformed": 1}
    assert actor.malformed == 3 and actor.received == 1
    assert cancels.get_nowait() == Cancel("job-1", "user") and cancels.empty()
    events = [(e["event"], e.get("reason"), e.get("offset")) for e in logs]
    assert events[:3] == [
        ("cancel_refused", "too_large", 0),
        ("cancel_refused", "id_too_long", 1),
        ("cancel_malformed", "malformed", 2),
    ]


def test_remembered_ids_are_bounded_in_bytes_the_oldest_forgotten_first() -> None:
    recent = RecentCancels(capacity=100, ttl_s=100, clock=FakeClock(), max_bytes=10)
    recent.add("aaaa")
    recent.add("bbbb")
    assert recent.bytes == 8
    recent.add("cccc")  # 12 bytes: the oldest goes
    assert "aaaa" not in recent and "bbbb" in recent and "cccc" in recent
    assert recent.bytes == 8 and len(recent) == 2
    recent.add("bbbb")  # again: now the newest, counted once
    recent.add("dd")
    assert recent.bytes == 10 and "cccc" in recent
    recent.add("é")  # two bytes of UTF-8
    assert "cccc" not in recent and recent.bytes == 8


def test_an_id_larger_than_the_whole_budget_is_not_remembered() -> None:
    recent = RecentCancels(capacity=100, ttl_s=100, clock=FakeClock(), max_bytes=4)
    recent.add("ab")
    recent.add("abcde")
    assert "abcde" not in recent and "ab" in recent and recent.bytes == 2


def test_expired_ids_give_their_bytes_back() -> None:
    clock = FakeClock()
    recent = RecentCancels(capacity=100, ttl_s=10, clock=clock, max_bytes=100)
    recent.add("abc")
    clock.now = 10.0
    assert recent.bytes == 0 and len(recent) == 0


def test_the_byte_bound_holds_before_the_count_does() -> None:
    recent = RecentCancels(capacity=64, ttl_s=100, clock=FakeClock(), max_bytes=16 * MAX_ID_BYTES)
    for i in range(64):
        recent.add(f"{i:04d}" + "x" * (MAX_ID_BYTES - 4))
    assert len(recent) == 16 and recent.bytes == 16 * MAX_ID_BYTES


def test_max_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RecentCancels(max_bytes=0)
