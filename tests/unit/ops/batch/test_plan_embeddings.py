"""A batch run's decisions for `/v1/embeddings` lines, without Kafka: each becomes an
`EmbedRequest`, its `EmbedResult` an embeddings answer, a cancel that leaves one unanswered an
error line; nothing of a settled result stays behind."""

from __future__ import annotations

from typing import Any

import msgspec

from messages.embedding import Embedding, EmbedRequest, EmbedResult, EmbedUsage
from messages.error_codes import ErrorCode
from messages.openai_batch import EMBEDDINGS_URL
from messages.result import ErrorInfo, ModelRef
from ops.batch.plan import MAX_ATTEMPTS, BatchPlan, InFlight
from tests.unit.ops.batch.test_plan import error_line, in_flight, new_run, result, sent


def embed_line(custom_id: str = "d1", **body: Any) -> bytes:
    body.setdefault("input", ["first text", "second text"])
    line = {"custom_id": custom_id, "url": EMBEDDINGS_URL, "body": body}
    return msgspec.json.encode(line) + b"\n"


def vectors(request_id: str, count: int = 2, **fields: Any) -> EmbedResult:
    data = [Embedding(index=i, embedding=[0.6, 0.8]) for i in range(count)]
    return EmbedResult(
        id=request_id,
        data=data,
        dimensions=2,
        usage=EmbedUsage(prompt_tokens=9, total_tokens=9),
        model=ModelRef(name="embeddinggemma-300m", digest="sha256:e", task="embed"),
        **fields,
    )


def settled(run: BatchPlan, answer: EmbedResult) -> dict[str, Any]:
    out = run.settle(answer)
    assert out is not None and not isinstance(out, InFlight) and out.response is not None
    line: dict[str, Any] = msgspec.to_builtins(out)
    return line


async def test_an_embeddings_line_becomes_an_embed_request_on_the_run_s_results_topic() -> None:
    run, _ = new_run(model="embeddinggemma-300m", default_max_tokens=64, openai_defaults=True)
    send = sent(run.plan(4, embed_line("d1", dimensions=256, prompt_name="document")))
    request = send.request
    assert isinstance(request, EmbedRequest)
    assert (request.id, request.reply_to) == (f"batch-{run.tag}-4", "tokenmill.results")
    assert (request.model, request.dimensions, request.prompt_name) == (
        "embeddinggemma-300m",
        256,
        "document",
    )
    assert request.input == ["first text", "second text"]
    assert request.metadata == {"custom_id": "d1"}
    assert (send.custom_id, send.url, send.line) == ("d1", EMBEDDINGS_URL, 4)


async def test_a_bad_embeddings_line_is_an_error_line_naming_its_field() -> None:
    run, _ = new_run()
    out = error_line(run.plan(1, embed_line("d1", input=[])))
    assert out.error is not None and (out.error.code, out.error.param) == ("empty_prompt", "input")
    unknown = error_line(run.plan(2, embed_line("d2", normalize=True)))
    assert unknown.error is not None and unknown.error.param == "normalize"


async def test_a_result_becomes_an_embeddings_answer_and_nothing_of_it_is_kept() -> None:
    run, progress = new_run()
    request_id = await in_flight(run, 1, embed_line("d1"))
    line = settled(run, vectors(request_id))
    assert line["custom_id"] == "d1"
    assert line["response"]["status_code"] == 200
    body = line["response"]["body"]
    assert body["object"] == "list" and body["model"] == "embeddinggemma-300m"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    summary = run.summary
    assert (summary.ok, summary.embeddings, summary.prompt_tokens) == (1, 2, 9)
    assert summary.completion_tokens == 0
    assert progress.calls == [("answered", True, 0)]
    assert run.pending == {}  # the window's slot is back and no vector is held
    assert run.settle(vectors(request_id)) is None  # a second answer is ignored


async def test_a_file_may_mix_embeddings_and_generation() -> None:
    run, _ = new_run()
    embed_id = await in_flight(run, 1, embed_line("d1"))
    chat_id = await in_flight(run, 2, msgspec.json.encode({
        "custom_id": "c1", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Hi"}]},
    }))  # fmt: skip
    chat = run.settle(result(chat_id))
    assert chat is not None and not isinstance(chat, InFlight) and chat.response is not None
    assert msgspec.to_builtins(chat.response.body)["object"] == "chat.completion"
    assert settled(run, vectors(embed_id))["response"]["body"]["object"] == "list"
    assert (run.summary.ok, run.summary.embeddings, run.summary.completion_tokens) == (2, 2, 6)


async def test_a_worker_s_refusal_is_the_line_s_error_response() -> None:
    run, _ = new_run()
    request_id = await in_flight(run, 1, embed_line("d1"))
    error = ErrorInfo(code=ErrorCode.UNSUPPORTED_TASK, message="this worker generates text")
    line = settled(run, vectors(request_id, 0, error=error))
    assert line["response"]["status_code"] == 400
    assert line["response"]["body"]["error"]["code"] == "unsupported_task"
    assert (run.summary.refused, run.summary.errors_by_code["unsupported_task"]) == (1, 1)


async def test_a_draining_worker_s_answer_sends_the_request_again() -> None:
    run, _ = new_run()
    request_id = await in_flight(run, 1, embed_line("d1"))
    draining = ErrorInfo(code=ErrorCode.SHUTTING_DOWN, message="draining")
    again = run.settle(vectors(request_id, 0, error=draining))
    assert isinstance(again, InFlight) and isinstance(again.request, EmbedRequest)
    assert again.request.id == f"{request_id}-r1" and again.attempt == 2 < MAX_ATTEMPTS
    run.track(again)
    assert settled(run, vectors(again.request.id))["response"]["status_code"] == 200


async def test_a_cancelled_one_is_counted_and_one_its_cancel_left_unanswered_too() -> None:
    run, progress = new_run()
    first = await in_flight(run, 6, embed_line("d0"))
    why = ErrorInfo(code=ErrorCode.CANCELLED, message="the request was cancelled")
    line = settled(run, vectors(first, 0, error=why))  # as the worker answers a cancel
    assert (line["response"]["status_code"], line["custom_id"]) == (499, "d0")
    assert line["response"]["body"]["error"]["code"] == "cancelled"
    request_id = await in_flight(run, 7, embed_line("d1"))
    out = run.abandoned(request_id)
    assert out.custom_id == "d1" and out.response is not None and out.error is None
    assert out.response.status_code == 499
    assert msgspec.to_builtins(out.response.body)["error"]["code"] == "cancelled"
    assert (run.summary.cancelled, run.summary.refused) == (2, 2)
    assert run.pending == {} and progress.calls == [("answered", False, 0)] * 2
    assert run.settle(vectors(request_id)) is None  # its late answer is ignored
