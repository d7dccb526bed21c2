"""What the GPU actor sends the emitter: a finished run's result to the request and each of its
copies, a streamed request's last chunk before its result, errors naming the active model,
and a count of those failed by a shutdown."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

from actors.generate.answers import SHUTDOWN, Answers
from actors.in_flight import InFlight
from actors.mail import Admitted, Outcome, RecordRef, StreamChunk
from actors.runtime import Mailbox
from actors.streaming.token_stream import TokenStream
from actors.telemetry.trace_context import TraceContext
from gpu.engine import Completion
from gpu.logprobs import CompletionLogprobs
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from messages.result import ErrorInfo, ModelRef, TokenLogprobs

ACTIVE = ModelRef(name="active", digest="sha-active")
RAN_ON = ModelRef(name="older", digest="sha-older")


def item(offset: int, request_id: str = "r-1", stream: bool = False) -> Admitted:
    request = GenerateRequest(id=request_id, prompt_token_ids=[5], max_new_tokens=4, stream=stream)
    return Admitted(
        request=request,
        record=RecordRef("lane.requests", 0, offset, 0),
        prompt_token_ids=[5],
        reply_topic="lane.results",
        content_type="application/json",
        trace=TraceContext(),
        consumed_at=time.monotonic(),
        deadline=None,
    )


def completion(request_id: str = "r-1") -> Completion:
    now = time.monotonic()
    return Completion(
        request_id=request_id, prompt_tokens=1, token_ids=[7, 8], text="ab",
        finish_reason="length", arrival_time=now, first_token_time=now, finish_time=now,
        num_preemptions=0,
    )  # fmt: skip


def answers() -> tuple[Answers, Mailbox[Outcome | StreamChunk]]:
    outcomes: Mailbox[Outcome | StreamChunk] = Mailbox(64)
    slots = SimpleNamespace(front=SimpleNamespace(ref=ACTIVE))  # only the active model is read
    return Answers(outcomes, cast(Any, slots), "w1"), outcomes


def sent(outcomes: Mailbox[Outcome | StreamChunk]) -> list[Outcome | StreamChunk]:
    out = []
    while not outcomes.empty():
        out.append(outcomes.get_nowait())
    return out


async def test_a_finished_run_answers_the_request_and_each_copy_naming_its_model() -> None:
    answer, outcomes = answers()
    entry = InFlight(item(1), cast(Any, None), model=RAN_ON, admitted_at=time.monotonic())
    entry.copies.append(item(2))
    await answer.finished(entry, completion())
    results = sent(outcomes)
    assert [cast(Outcome, o).record.offset for o in results] == [1, 2]
    for outcome in results:
        assert isinstance(outcome, Outcome)
        assert outcome.result.text == "ab" and outcome.result.token_ids == [7, 8]
        assert outcome.result.model == RAN_ON and outcome.result.error is None
    assert answer.failed_on_shutdown == 0


async def test_a_runs_logprobs_reach_every_result() -> None:
    answer, outcomes = answers()
    entry = InFlight(item(1), cast(Any, None), model=RAN_ON, admitted_at=time.monotonic())
    entry.copies.append(item(2))
    logprobs = CompletionLogprobs(
        tokens=["a", "b"], token_logprobs=[-0.5, -1.0], top_ids=[[7, 9], [8, 9]],
        top_logprobs=[[-0.5, -1.5], [-1.0, -1.25]], top_tokens=[["a", "c"], ["b", "c"]],
    )  # fmt: skip
    await answer.finished(entry, replace(completion(), logprobs=logprobs))
    for outcome in sent(outcomes):
        assert isinstance(outcome, Outcome)
        assert outcome.result.logprobs == TokenLogprobs(
            tokens=["a", "b"], token_logprobs=[-0.5, -1.0], top_ids=[[7, 9], [8, 9]],
            top_logprobs=[[-0.5, -1.5], [-1.0, -1.25]], top_tokens=[["a", "c"], ["b", "c"]],
        )  # fmt: skip


async def test_a_runs_prompt_logprobs_and_text_reach_the_result() -> None:
    answer, outcomes = answers()
    entry = InFlight(item(1), cast(Any, None), model=RAN_ON, admitted_at=time.monotonic())
    prompt = CompletionLogprobs(
        tokens=["x", "y"], token_logprobs=[0.0, -2.0], top_ids=[[], [4]], top_logprobs=[[], [-1.0]],
        top_tokens=[[], ["z"]], unscored_first=True, token_ids=[5, 6],
    )  # fmt: skip
    await answer.finished(
        entry, replace(completion(), prompt_logprobs=prompt, prompt_text="xy", token_ids=[])
    )
    [outcome] = sent(outcomes)
    assert isinstance(outcome, Outcome)
    assert outcome.result.prompt_text == "xy"
    assert outcome.result.prompt_logprobs == TokenLogprobs(
        tokens=["x", "y"], token_logprobs=[0.0, -2.0], top_ids=[[], [4]], top_logprobs=[[], [-1.0]],
        top_tokens=[[], ["z"]], unscored_first=True, token_ids=[5, 6],
    )  # fmt: skip
    assert outcome.result.usage.completion_tokens == 0


async def test_a_streamed_requests_last_chunk_goes_before_its_result() -> None:
    answer, outcomes = answers()
    stream = TokenStream(
        "r-1", "run-1", lambda ids: "".join(chr(96 + i % 26) for i in ids), stop=[],
        interval_tokens=100, interval_s=60.0, min_interval_s=0.0, started=time.monotonic(),
    )  # fmt: skip
    entry = InFlight(item(1, stream=True), cast(Any, None), model=RAN_ON, admitted_at=0.0)
    entry.streams = [stream]
    for token in (7, 8):
        stream.add(token)
    await answer.finished(entry, completion())
    first, last = sent(outcomes)
    assert isinstance(first, StreamChunk) and first.chunk.token_ids == [7, 8]
    assert isinstance(last, Outcome) and last.result.token_ids == [7, 8]
    assert answer.chunks_sent == 1


async def test_an_error_names_the_active_model_and_a_shutdown_is_counted() -> None:
    answer, outcomes = answers()
    refused = ErrorInfo(code=ErrorCode.DUPLICATE_REQUEST, message="in use")
    await answer.error(item(1), refused)
    await answer.error(item(2), SHUTDOWN)
    first, second = sent(outcomes)
    assert isinstance(first, Outcome) and isinstance(second, Outcome)
    assert first.result.error == refused and first.result.model == ACTIVE
    assert first.result.text == "" and first.result.token_ids == []
    assert second.result.error == SHUTDOWN
    assert answer.failed_on_shutdown == 1, "only the shutdown's"


async def test_a_run_failed_by_the_shutdown_counts_each_copy() -> None:
    answer, outcomes = answers()
    entry = InFlight(item(1), cast(Any, None), model=RAN_ON, admitted_at=time.monotonic())
    entry.copies.append(item(2))
    await answer.finished(entry, completion(), SHUTDOWN)
    assert len(sent(outcomes)) == 2 and answer.failed_on_shutdown == 2


async def test_a_run_with_choices_answers_every_choice() -> None:
    answer, outcomes = answers()
    entry = InFlight(item(1), cast(Any, None), model=RAN_ON, admitted_at=time.monotonic())
    first, second = (
        completion(),
        replace(completion(), token_ids=[9], text="c", finish_reason="stop"),
    )
    await answer.finished(entry, replace(first, choices=(first, second)))
    [outcome] = sent(outcomes)
    assert isinstance(outcome, Outcome)
    result = outcome.result
    assert [(c.index, c.text, c.token_ids, str(c.finish_reason)) for c in result.choices] == [
        (0, "ab", [7, 8], "length"),
        (1, "c", [9], "stop"),
    ]
    assert (result.text, result.usage.completion_tokens) == ("ab", 3)


async def test_a_runs_draft_counts_reach_every_results_usage() -> None:
    answer, outcomes = answers()
    entry = InFlight(item(1), cast(Any, None), model=RAN_ON, admitted_at=time.monotonic())
    entry.copies.append(item(2))
    await answer.finished(entry, replace(completion(), draft_tokens=5, accepted_draft_tokens=1))
    for outcome in sent(outcomes):
        assert isinstance(outcome, Outcome)
        usage = outcome.result.usage
        assert (usage.accepted_draft_tokens, usage.rejected_draft_tokens) == (1, 4)
