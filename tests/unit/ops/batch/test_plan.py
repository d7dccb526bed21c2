"""A batch run's decisions without Kafka: `BatchPlan.plan` per line, `.settle` per result.

`plan` turns a line into a request to send, an error line, or nothing (answered by an earlier
run); `settle` turns a result into an output line when it answers one of ours in flight. Also
`count_lines` and what `BatchSummary` reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from messages.error_codes import ErrorCode
from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL, BatchOutputLine
from messages.result import ErrorInfo, FinishReason, GenerateResult, Usage
from ops.batch.output import Answered
from ops.batch.plan import MAX_ATTEMPTS, BatchPlan, InFlight
from ops.batch.summary import BatchSummary, count_lines

HI = [{"role": "user", "content": "Hi"}]


@dataclass
class RecordingProgress:
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def started(self, total: int, already: int) -> None:
        self.calls.append(("started", total, already))

    def answered(self, ok: bool, completion_tokens: int) -> None:
        self.calls.append(("answered", ok, completion_tokens))

    def finished(self) -> None:
        self.calls.append(("finished",))


def new_run(
    *already: str, line_numbers: tuple[int, ...] = (), **options: Any
) -> tuple[BatchPlan, RecordingProgress]:
    """A run whose output file already answers the custom_ids `already` and the id-less lines
    `line_numbers`. Call inside an event loop (the window is an asyncio.Semaphore)."""
    answered = Answered(line_numbers=set(line_numbers))
    for key in already:
        answered.keys.add(key)
    progress = RecordingProgress()
    options.setdefault("max_inflight", 256)
    options.setdefault("results_topic", "tokenmill.results")
    summary = BatchSummary(input="in.jsonl", output="out.jsonl")
    plan = BatchPlan(answered=answered, progress=progress, summary=summary, **options)
    return plan, progress


def line(custom_id: Any = "q1", url: str = CHAT_COMPLETIONS_URL, **body: Any) -> bytes:
    if url == CHAT_COMPLETIONS_URL:
        body.setdefault("messages", HI)
    else:
        body.setdefault("prompt", "Hi")
    return msgspec.json.encode({"custom_id": custom_id, "url": url, "body": body}) + b"\n"


def sent(planned: object) -> InFlight:
    assert isinstance(planned, InFlight), planned
    return planned


def error_line(planned: object) -> BatchOutputLine:
    assert isinstance(planned, BatchOutputLine), planned
    assert planned.response is None
    assert planned.error is not None
    return planned


def result(request_id: str, **fields: Any) -> GenerateResult:
    fields.setdefault("text", "Hello")
    fields.setdefault("finish_reason", FinishReason.STOP)
    fields.setdefault("usage", Usage(prompt_tokens=4, completion_tokens=6, total_tokens=10))
    return GenerateResult(id=request_id, **fields)


async def in_flight(run: BatchPlan, number: int, raw: bytes) -> str:
    """Plan a line and register it as sent, as the feeder does; returns the request id."""
    send = sent(run.plan(number, raw))
    await run.window.acquire()
    run.track(send)
    return send.request.id


# --- plan -----------------------------------------------------------------------------------


async def test_a_good_line_becomes_a_request_to_send() -> None:
    run, progress = new_run()
    send = sent(run.plan(3, line("capital", max_tokens=24)))
    assert send.request.id == f"batch-{run.tag}-3"
    assert send.request.metadata == {"custom_id": "capital"}
    assert send.request.max_new_tokens == 24
    assert (send.custom_id, send.url, send.line) == ("capital", CHAT_COMPLETIONS_URL, 3)
    assert (run.summary.line_errors, run.summary.already) == (0, 0)
    assert progress.calls == []


async def test_request_ids_differ_between_lines_and_between_runs() -> None:
    run, _ = new_run()
    other, _ = new_run()
    ids = {
        sent(run.plan(1, line("a"))).request.id,
        sent(run.plan(2, line("b"))).request.id,
        sent(other.plan(1, line("a"))).request.id,
    }
    assert len(ids) == 3


async def test_the_run_options_reach_the_request() -> None:
    run, _ = new_run(model="smollm2-135m", default_max_tokens=64)
    send = sent(run.plan(1, line("c1", url=COMPLETIONS_URL, model="other")))
    assert (send.request.model, send.request.max_new_tokens) == ("smollm2-135m", 64)
    assert (send.custom_id, send.url) == ("c1", COMPLETIONS_URL)


async def test_omitted_fields_are_the_wire_s_unless_the_run_reads_them_as_openai_does() -> None:
    wire, _ = new_run()
    plain = sent(wire.plan(1, line("c1"))).request
    assert (plain.model_defaults, plain.max_new_tokens, plain.temperature) == ([], 16, 0.0)
    openai, _ = new_run(openai_defaults=True)
    read = sent(openai.plan(1, line("c1"))).request
    assert read.model_defaults == ["max_new_tokens", "temperature", "top_p", "top_k"]


async def test_an_unknown_field_in_a_file_is_an_error_line_naming_it() -> None:
    run, _ = new_run(openai_defaults=True)
    out = error_line(run.plan(1, line("q1", frobnicate=1)))
    assert out.error is not None and out.error.param == "frobnicate"


async def test_a_duplicate_custom_id_on_a_later_line_is_an_error_line() -> None:
    run, progress = new_run()
    sent(run.plan(1, line("q1")))
    out = error_line(run.plan(4, line("q1")))
    assert out.custom_id is None, "the id belongs to the first line; this one is keyed by number"
    assert out.error is not None
    assert (out.error.code, out.error.line, out.error.param) == (
        "duplicate_custom_id",
        4,
        "custom_id",
    )
    assert run.summary.line_errors == 1
    assert run.summary.errors_by_code == {"duplicate_custom_id": 1}
    assert progress.calls == [("answered", False, 0)]


async def test_a_duplicate_of_a_refused_line_is_still_a_duplicate() -> None:
    run, _ = new_run()
    first = error_line(run.plan(1, line("q1", suffix="!")))
    assert first.error is not None
    assert (first.custom_id, first.error.code) == ("q1", "unsupported_parameter")
    second = error_line(run.plan(2, line("q1")))
    assert second.error is not None
    assert (second.custom_id, second.error.code) == (None, "duplicate_custom_id")


async def test_a_line_already_answered_is_skipped() -> None:
    run, progress = new_run("q1")
    assert run.plan(1, line("q1")) is None
    assert run.summary.already == 1
    assert (run.summary.line_errors, progress.calls) == (0, [])


async def test_a_bad_line_already_answered_by_custom_id_is_skipped() -> None:
    run, _ = new_run("q1")
    assert run.plan(1, line("q1", suffix="!")) is None
    assert error_line(run.plan(2, line("q2", suffix="!"))).custom_id == "q2"
    assert run.summary.already == 1


async def test_an_id_less_bad_line_already_answered_is_skipped_by_its_number() -> None:
    run, _ = new_run(line_numbers=(3,))
    assert run.plan(3, b"{not json\n") is None
    assert run.summary.already == 1
    out = error_line(run.plan(4, b"{not json\n"))
    assert out.error is not None
    assert (out.custom_id, out.error.line) == (None, 4)
    assert run.summary.line_errors == 1


async def test_an_answered_duplicate_is_skipped_by_its_number() -> None:
    run, _ = new_run(line_numbers=(2,))
    sent(run.plan(1, line("q1")))
    assert run.plan(2, line("q1")) is None
    assert run.summary.already == 1


async def test_on_resume_a_duplicate_of_an_answered_line_is_still_refused() -> None:
    run, _ = new_run("q1")
    assert run.plan(1, line("q1")) is None
    out = error_line(run.plan(2, line("q1")))
    assert out.error is not None
    assert out.error.code == "duplicate_custom_id"


@pytest.mark.parametrize(
    ("raw", "custom_id", "code"),
    [
        (b"{not json\n", None, "invalid_json"),
        (msgspec.json.encode({"url": CHAT_COMPLETIONS_URL, "body": {}}), None, "missing_custom_id"),
        (line("e1", url="/v1/moderations"), "e1", "unsupported_url"),
        (line("s2", suffix="!"), "s2", "unsupported_parameter"),
        (line("t1", temperature=-1), "t1", "invalid_sampling_params"),
        (line("m0", messages=[]), "m0", "invalid_body"),
    ],
)
async def test_a_bad_line_becomes_an_error_line(
    raw: bytes, custom_id: str | None, code: str
) -> None:
    run, progress = new_run()
    out = error_line(run.plan(5, raw))
    assert out.error is not None
    assert (out.custom_id, out.error.code, out.error.line) == (custom_id, code, 5)
    assert out.id.startswith("batch_req_")
    assert run.summary.line_errors == 1
    assert run.summary.errors_by_code == {code: 1}
    assert progress.calls == [("answered", False, 0)]


async def test_line_errors_are_counted_by_code() -> None:
    run, _ = new_run()
    for number, raw in enumerate(
        [b"[]", b"{", line("a", suffix="!"), line("b", stream=True)], start=1
    ):
        error_line(run.plan(number, raw))
    assert run.summary.line_errors == 4
    assert run.summary.errors_by_code == {"invalid_json": 2, "unsupported_parameter": 2}


# --- settle ---------------------------------------------------------------------------------


async def test_a_result_for_an_unknown_id_is_ignored() -> None:
    run, progress = new_run()
    await in_flight(run, 1, line("q1"))
    assert run.settle(result("someone-elses")) is None
    assert len(run.pending) == 1
    assert (run.summary.ok, run.summary.refused, progress.calls) == (0, 0, [])


async def test_a_result_for_a_pending_request_becomes_its_output_line() -> None:
    run, progress = new_run(max_inflight=1)
    request_id = await in_flight(run, 1, line("capital"))
    assert run.window.locked()
    out = run.settle(result(request_id, text="Paris."))
    assert out is not None
    assert out.custom_id == "capital"
    assert out.response is not None
    assert (out.response.status_code, out.response.request_id) == (200, request_id)
    assert out.response.body.object == "chat.completion"
    assert out.response.body.choices[0].message.content == "Paris."
    assert run.pending == {}
    assert not run.window.locked(), "settling frees a place in the window"
    assert (run.summary.ok, run.summary.refused) == (1, 0)
    assert (run.summary.prompt_tokens, run.summary.completion_tokens) == (4, 6)
    assert progress.calls == [("answered", True, 6)]


async def test_a_tool_call_line_is_answered_with_tool_calls() -> None:
    run, _ = new_run()
    tool = {"type": "function", "function": {"name": "ping"}}
    request_id = await in_flight(run, 1, line("call", tools=[tool], tool_choice="required"))
    out = run.settle(result(request_id, text='{"name":"ping","arguments":{}}'))
    assert out is not None and out.response is not None
    (choice,) = out.response.body.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "ping"


async def test_a_second_result_for_the_same_request_is_ignored() -> None:
    run, progress = new_run()
    request_id = await in_flight(run, 1, line("q1"))
    assert run.settle(result(request_id)) is not None
    assert run.settle(result(request_id)) is None
    assert run.summary.ok == 1
    assert (run.summary.prompt_tokens, run.summary.completion_tokens) == (4, 6)
    assert len(progress.calls) == 1


async def test_an_error_result_is_counted_as_refused_by_code() -> None:
    run, progress = new_run()
    first = await in_flight(run, 1, line("a", url=COMPLETIONS_URL))
    second = await in_flight(run, 2, line("b"))
    error = ErrorInfo(code=ErrorCode.PROMPT_TOO_LONG, message="too long")
    usage = Usage(prompt_tokens=900, completion_tokens=0, total_tokens=900)
    out = run.settle(result(first, text="", error=error, usage=usage))
    assert out is not None
    assert out.response is not None
    assert (out.custom_id, out.response.status_code) == ("a", 400)
    assert run.settle(result(second)) is not None
    assert (run.summary.ok, run.summary.refused) == (1, 1)
    assert run.summary.errors_by_code == {"prompt_too_long": 1}
    assert (run.summary.prompt_tokens, run.summary.completion_tokens) == (904, 6)
    assert progress.calls == [("answered", False, 0), ("answered", True, 6)]


async def test_results_settle_in_any_order() -> None:
    run, _ = new_run()
    ids = [await in_flight(run, n, line(f"q{n}")) for n in (1, 2, 3)]
    outs = [run.settle(result(request_id)) for request_id in reversed(ids)]
    assert [out.custom_id for out in outs if out is not None] == ["q3", "q2", "q1"]
    assert run.pending == {}


# --- count_lines and BatchSummary -----------------------------------------------------------


def test_count_lines_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\n   \n\t\r\n{"b": 2}\n{"c": 3}')
    assert count_lines(path) == 3


def test_count_lines_of_an_empty_file_is_zero(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.touch()
    assert count_lines(path) == 0


def summary(**fields: Any) -> BatchSummary:
    return BatchSummary(input="in.jsonl", output="out.jsonl", **fields)


@pytest.mark.parametrize(
    ("fields", "complete"),
    [
        ({}, True),
        ({"total": 5, "ok": 3, "refused": 1, "line_errors": 1}, True),
        ({"total": 5, "already": 2, "ok": 3}, True),
        ({"total": 5, "already": 2, "ok": 2}, False),
        ({"total": 5, "ok": 5, "in_flight": 1}, False),
        ({"total": 5, "ok": 4, "in_flight": 1, "stalled": True}, False),
    ],
)
def test_a_summary_is_complete_when_every_line_is_answered(
    fields: dict[str, Any], complete: bool
) -> None:
    assert summary(**fields).complete is complete


def test_as_json_reports_every_count() -> None:
    report = summary(
        total=10,
        already=2,
        sent=7,
        ok=5,
        refused=1,
        line_errors=2,
        prompt_tokens=100,
        completion_tokens=250,
        in_flight=1,
        wall_s=2.00049,
        stalled=True,
    )
    report.errors_by_code.update({"unsupported_url": 1, "engine_error": 1, "invalid_json": 1})
    assert report.as_json() == {
        "input": "in.jsonl",
        "output": "out.jsonl",
        "complete": False,
        "total_lines": 10,
        "already_answered": 2,
        "answered": 8,
        "ok": 5,
        "refused": 1,
        "line_errors": 2,
        "retried": 0,
        "cancelled": 0,
        "cancel_requested": False,
        "errors_by_code": {"engine_error": 1, "invalid_json": 1, "unsupported_url": 1},
        "in_flight_at_end": 1,
        "stalled": True,
        "prompt_tokens": 100,
        "completion_tokens": 250,
        "embeddings": 0,
        "wall_s": 2.0,
        "requests_per_s": 4.0,
        "completion_tokens_per_s": 124.97,
        "peak_rss_mb": None,
    }
    by_code = report.as_json()["errors_by_code"]
    assert isinstance(by_code, dict)
    assert list(by_code) == sorted(by_code), "codes are listed in order"


def test_as_json_of_an_instant_run_does_not_divide_by_zero() -> None:
    report = summary().as_json()
    assert (report["wall_s"], report["requests_per_s"], report["complete"]) == (0.0, 0.0, True)
    assert msgspec.json.decode(msgspec.json.encode(report)) == report


async def test_requests_ask_for_their_results_on_the_clients_results_topic() -> None:
    run, _ = new_run(results_topic="my.results")
    assert sent(run.plan(1, line("a"))).request.reply_to == "my.results"


async def test_a_line_nested_too_deeply_is_an_error_line_not_a_crash() -> None:
    run, _ = new_run()
    out = error_line(run.plan(1, b"[" * 5000 + b"\n"))
    assert out.error is not None and out.error.code == "invalid_json"


async def test_a_request_the_worker_could_not_run_is_sent_again_then_answered() -> None:
    run, _ = new_run(max_inflight=1)
    request_id = await in_flight(run, 1, line("q1"))
    shutting_down = ErrorInfo(code=ErrorCode.SHUTTING_DOWN, message="draining")
    again = sent(run.settle(result(request_id, error=shutting_down)))
    assert again.request.id != request_id and again.custom_id == "q1" and again.attempt == 2
    assert run.window.locked(), "the resend keeps the slot"
    run.track(again)
    out = run.settle(result(again.request.id))
    assert isinstance(out, BatchOutputLine) and out.response is not None
    assert out.response.status_code == 200
    assert (run.summary.retried, run.summary.ok) == (1, 1)
    assert not run.window.locked()


async def test_a_request_is_sent_at_most_max_attempts_times() -> None:
    run, _ = new_run()
    request_id = await in_flight(run, 1, line("q1"))
    failed = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message="step failed")
    for _ in range(MAX_ATTEMPTS - 1):
        again = sent(run.settle(result(request_id, error=failed)))
        run.track(again)
        request_id = again.request.id
    out = run.settle(result(request_id, error=failed))
    assert isinstance(out, BatchOutputLine) and out.response is not None
    assert out.response.status_code == 500
    assert (run.summary.retried, run.summary.refused) == (MAX_ATTEMPTS - 1, 1)


async def test_a_request_kafka_will_not_take_becomes_an_error_line_for_its_line() -> None:
    run, _ = new_run(max_inflight=1)
    request_id = await in_flight(run, 7, line("big"))
    out = run.unsendable(request_id, RuntimeError("too large"))
    assert out.error is not None
    assert (out.custom_id, out.error.code, out.error.line) == ("big", "message_too_large", 7)
    assert run.pending == {} and not run.window.locked()
