"""Taking cancelled requests out of what is held: length buckets, queued batches; the cancel
record's decoding; where a cancel found its request, on the request's span. Pure logic."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from actors.cancel.actor import Refused, decode_cancel
from actors.cancel.held import take_from_batches
from actors.ingest.buckets import BucketConfig, LengthBuckets
from actors.mail import Admitted, Batch, Outcome, RecordRef
from actors.telemetry.trace_context import TraceContext
from actors.telemetry.tracing import start_request_spans
from messages.cancel import CancelRequest, cancel_codec
from messages.codec import MSGPACK
from messages.request import GenerateRequest
from messages.result import FinishReason
from tests.unit.actors.telemetry.test_tracing import NOW, outcome
from tests.unit.span_capture import SpanCapture


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def buckets() -> tuple[LengthBuckets[str], FakeClock]:
    clock = FakeClock()
    return LengthBuckets(BucketConfig((32, 64), 1000, 8, 0.010), clock), clock


def test_remove_takes_every_copy_and_keeps_the_rest_in_order() -> None:
    held, _ = buckets()
    for name, tokens in [("a", 10), ("x", 12), ("b", 40), ("x", 50), ("c", 11)]:
        assert held.add(name, tokens) == []
    assert held.remove(lambda item: item == "x") == ["x", "x"]
    assert (len(held), held.tokens) == (3, 61)
    assert held.remove(lambda item: item == "x") == []
    (small, large) = held.drain()
    assert (small.items, small.tokens, large.items, large.tokens) == (["a", "c"], 21, ["b"], 40)


def test_a_bucket_keeps_its_deadline_after_a_removal() -> None:
    held, clock = buckets()
    held.add("first", 10)
    clock.now = 0.005
    held.add("second", 10)
    held.remove(lambda item: item == "first")
    assert held.next_deadline() == 0.010, "flushed no later than before"
    held.remove(lambda item: item == "second")
    assert held.next_deadline() is None and len(held) == 0 and held.tokens == 0


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 80)), max_size=30))
def test_every_item_still_leaves_exactly_once(adds: list[tuple[str, int]]) -> None:
    held, _ = buckets()
    out: list[str] = []
    for name, tokens in adds:
        out += [item for f in held.add(name, tokens) for item in f.items]
    out += held.remove(lambda item: item == "a")
    out += [item for f in held.drain() for item in f.items]
    assert sorted(out) == sorted(name for name, _ in adds)
    assert len(held) == 0 and held.tokens == 0


def item(request_id: str, offset: int) -> Admitted:
    return Admitted(
        request=GenerateRequest(id=request_id, prompt_token_ids=[1]),
        record=RecordRef("requests", 0, offset, 0),
        prompt_token_ids=[1],
        reply_topic="results",
        content_type="application/json",
        trace=TraceContext(),
        consumed_at=time.monotonic(),
        deadline=None,
    )


def test_take_from_batches_drops_emptied_batches() -> None:
    only = Batch(bucket=32, items=[item("x", 0)], tokens=1, reason="wait")
    mixed = Batch(bucket=32, items=[item("a", 1), item("x", 2), item("b", 3)], tokens=3,
                  reason="size")  # fmt: skip
    left, taken = take_from_batches([only, mixed], "x")
    assert [i.record.offset for i in taken] == [0, 2]
    assert left == [mixed] and [i.request.id for i in mixed.items] == ["a", "b"]
    same, none = take_from_batches(left, "unknown")
    assert same is left and none == []


def test_a_cancel_record_decodes_from_json_or_msgpack() -> None:
    cancel = CancelRequest(id="job-1", reason="user")
    assert decode_cancel(cancel_codec.encode(cancel), None) == cancel
    packed = cancel_codec.encode(cancel, MSGPACK)
    assert decode_cancel(packed, MSGPACK.encode()) == cancel
    assert decode_cancel(b'{"id": "job-2", "later_field": 1}', b"application/json") == (
        CancelRequest(id="job-2")
    )


def test_a_bad_cancel_record_says_why() -> None:
    for value, ctype in [(b"not json", None), (None, None), (b'{"id": ""}', None),
                         (b'{"id": 7}', None), (b'{"id": "x"}', b"text/csv")]:  # fmt: skip
        assert isinstance(decode_cancel(value, ctype), Refused), value


def test_the_process_span_says_where_a_cancel_found_the_request() -> None:
    def attributes(item: Outcome) -> dict[str, object]:
        capture = SpanCapture()
        start_request_spans(item, group="g", now_ns=NOW, recorder=capture.recorder).end()
        return dict(capture.by_name()["process reqs"].attributes)

    assert "tokenmill.cancelled_in" not in attributes(outcome())
    stopped = outcome()
    stopped.result.finish_reason = FinishReason.CANCELLED
    assert attributes(stopped)["tokenmill.cancelled_in"] == "engine"
    stopped.cancelled_in = "bucket"
    spans = attributes(stopped)
    assert spans["tokenmill.cancelled_in"] == "bucket"
    assert spans["gen_ai.response.finish_reasons"] == ["cancelled"]
