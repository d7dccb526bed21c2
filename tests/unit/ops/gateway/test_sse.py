"""Streamed answers in OpenAI's chunk shapes, and the text each event carries."""

from __future__ import annotations

import functools
import json

import msgspec
import pytest

from messages.chunk import GenerateChunk
from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL
from messages.openai_batch_answers import answer_line
from messages.result import Choice, FinishReason, GenerateResult, TokenLogprobs, Usage
from messages.tool_parsing import stream_for
from ops.gateway.sse import DONE, ChunkShape, Piece, StreamCursor, StreamEvents
from ops.gateway.tool_stream import CallText


def data(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])


def test_chat_chunks_carry_deltas_then_a_finish_then_usage() -> None:
    shape = ChunkShape(CHAT_COMPLETIONS_URL, "r1", "smollm2-135m", 7, include_usage=True)
    first, text = data(shape.role()), data(shape.text(0, Piece("Hel")))
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-r1"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text["choices"][0] == {
        "index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None
    }  # fmt: skip
    assert text["usage"] is None
    last = data(shape.text(0, Piece("lo"), "stop"))["choices"][0]
    assert last["delta"] == {"content": "lo"} and last["finish_reason"] == "stop"
    assert data(shape.text(0, Piece(""), "stop"))["choices"][0]["delta"] == {}
    result = GenerateResult(
        id="r1",
        usage=Usage(
            prompt_tokens=3, completion_tokens=2, total_tokens=5, cached_tokens=1,
            accepted_draft_tokens=1, rejected_draft_tokens=2,
        ),
    )  # fmt: skip
    usage = data(shape.usage(result))
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1},
        "completion_tokens_details": {
            "accepted_prediction_tokens": 1,
            "rejected_prediction_tokens": 2,
        },
    }


def test_completion_chunks_are_text_completions() -> None:
    shape = ChunkShape(COMPLETIONS_URL, "r2", "m", 7)
    event = data(shape.text(0, Piece(" Paris")))
    assert event["object"] == "text_completion" and event["id"] == "cmpl-r2"
    assert event["choices"][0]["text"] == " Paris"
    assert "usage" not in event
    assert data(shape.text(0, Piece("."), "length"))["choices"][0]["finish_reason"] == "length"


def test_done_ends_the_stream() -> None:
    assert DONE == b"data: [DONE]\n\n"


def chunk(seq: int, text: str, run: str = "a", **fields: object) -> GenerateChunk:
    return GenerateChunk(id="r", run=run, seq=seq, text=text, **fields)  # type: ignore[arg-type]


def texts(pieces: list[Piece | None]) -> list[str]:
    return [p.text if p else "" for p in pieces]


def test_the_cursor_sends_each_text_once_in_order_holding_its_last_character() -> None:
    cursor = StreamCursor()
    assert texts([cursor.add(chunk(0, "The"))]) == ["Th"]
    assert cursor.add(chunk(2, " is")) is None  # waits for seq 1
    assert texts([cursor.add(chunk(1, " sky"))]) == ["e sky i"]
    assert cursor.add(chunk(1, " sky")) is None  # a duplicate
    result = Choice(index=0, text="The sky is blue", finish_reason=FinishReason.STOP)
    assert cursor.finish(result).text == "s blue"


def test_a_run_again_sends_only_past_what_was_sent() -> None:
    cursor = StreamCursor()
    assert texts([cursor.add(chunk(0, "The sky"))]) == ["The sk"]
    assert cursor.add(chunk(0, "The", run="b")) is None
    assert texts([cursor.add(chunk(1, " sky is", run="b"))]) == ["y i"]
    assert cursor.finish(Choice(index=0, text="The sky is")).text == "s"


def lp(*tokens: str) -> TokenLogprobs:
    return TokenLogprobs(
        tokens=list(tokens),
        token_logprobs=[-1.0 - i for i in range(len(tokens))],
        top_ids=[[i] for i in range(len(tokens))],
        top_logprobs=[[-0.5] for _ in tokens],
        top_tokens=[["x"] for _ in tokens],
    )


def test_logprobs_go_with_the_next_text_and_add_up_to_the_result_s() -> None:
    cursor = StreamCursor()
    whole = lp("A", "b", "<eos>")
    first = cursor.add(chunk(0, "A", token_ids=[1], logprobs=lp("A")))
    assert first is None  # "A" is held back: its logprobs wait with it
    second = cursor.add(chunk(1, "b", token_ids=[2], logprobs=msgspec.structs.replace(
        lp("A", "b"), tokens=["b"], token_logprobs=[-2.0], top_ids=[[1]],
        top_logprobs=[[-0.5]], top_tokens=[["x"]])))  # fmt: skip
    assert second is not None and second.text == "A" and second.offset == 0
    assert second.logprobs is not None and second.logprobs.tokens == ["A", "b"]
    last = cursor.finish(Choice(index=0, text="Ab", logprobs=whole))
    assert last.text == "b" and last.offset == 2
    assert last.logprobs is not None and last.logprobs.tokens == ["<eos>"]
    assert last.logprobs.token_logprobs == [-3.0]


def events_of(url: str, replies: list[GenerateChunk | GenerateResult], **kw: object) -> list:
    shape = ChunkShape(url, "r", "m", 7)
    stream = StreamEvents(shape, **kw)  # type: ignore[arg-type]
    out = [data(e) for e in stream.start()]
    for reply in replies:
        sent = stream.result(reply) if isinstance(reply, GenerateResult) else stream.chunk(reply)
        out += [data(e) for e in sent]
    return out


@pytest.mark.parametrize("url", [CHAT_COMPLETIONS_URL, COMPLETIONS_URL])
def test_the_last_text_carries_the_finish_reason(url: str) -> None:
    result = GenerateResult(id="r", text="Hello there", finish_reason=FinishReason.LENGTH)
    replies = [chunk(0, "Hello"), chunk(1, " there"), result]
    out = events_of(url, replies)
    pieces = [c for e in out for c in e["choices"]]
    key = (lambda c: c["delta"].get("content")) if url == CHAT_COMPLETIONS_URL else "text"
    got = [key(c) if callable(key) else c[key] for c in pieces]
    if url == CHAT_COMPLETIONS_URL:
        assert got[0] == ""  # the role's
        got = got[1:]
    assert "".join(got) == "Hello there" and None not in got
    assert [c["finish_reason"] for c in pieces][-1] == "length"
    assert pieces[-1].get("text", pieces[-1].get("delta", {}).get("content")) == "e"


def test_n_choices_stream_under_their_index_and_each_finishes() -> None:
    result = GenerateResult(
        id="r",
        text="ab",
        choices=[
            Choice(index=0, text="ab", finish_reason=FinishReason.STOP),
            Choice(index=1, text="cd", finish_reason=FinishReason.LENGTH),
        ],
    )
    replies = [chunk(0, "a", index=0), chunk(0, "cd", index=1), chunk(1, "b", index=0), result]
    out = events_of(COMPLETIONS_URL, replies, n=2)
    by_index: dict[int, list[str]] = {0: [], 1: []}
    finish = {}
    for e in out:
        [c] = e["choices"]
        by_index[c["index"]].append(c["text"])
        if c["finish_reason"]:
            finish[c["index"]] = c["finish_reason"]
    assert {i: "".join(t) for i, t in by_index.items()} == {0: "ab", 1: "cd"}
    assert finish == {0: "stop", 1: "length"}


@pytest.mark.parametrize("url", [CHAT_COMPLETIONS_URL, COMPLETIONS_URL])
def test_streamed_logprobs_equal_the_answer_s(url: str) -> None:
    whole = lp("Hi", " you", "!")
    result = GenerateResult(id="r", text="Hi you!", logprobs=whole, finish_reason="stop")
    replies = [
        chunk(0, "Hi", token_ids=[1], logprobs=msgspec.structs.replace(whole, **{
            k: getattr(whole, k)[:1] for k in
            ("tokens", "token_logprobs", "top_ids", "top_logprobs", "top_tokens")})),
        chunk(1, " you!", token_ids=[2, 3], logprobs=msgspec.structs.replace(whole, **{
            k: getattr(whole, k)[1:] for k in
            ("tokens", "token_logprobs", "top_ids", "top_logprobs", "top_tokens")})),
        result,
    ]  # fmt: skip
    out = events_of(url, replies)
    body = msgspec.to_builtins(answer_line("r", url, result).response.body)  # type: ignore[union-attr]
    want = body["choices"][0]["logprobs"]
    got = [c["logprobs"] for e in out for c in e["choices"] if c["logprobs"] is not None]
    if url == CHAT_COMPLETIONS_URL:
        assert [t for g in got for t in g["content"]] == want["content"]
    else:
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [v for g in got for v in g[key]] == want[key]


def test_a_constrained_tool_call_streams_its_name_then_its_arguments() -> None:
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    result = GenerateResult(id="r", text=text, finish_reason=FinishReason.STOP)
    replies = [chunk(0, text[:10]), chunk(1, text[10:30]), chunk(2, text[30:]), result]
    out = events_of(CHAT_COMPLETIONS_URL, replies, tools=CallText)
    deltas = [c["delta"] for e in out[1:] for c in e["choices"]]
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert all(call["index"] == 0 for call in calls)
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert json.loads(arguments) == {"city": "Paris"} and arguments == '{"city":"Paris"}'
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("content" not in d for d in deltas)


def test_a_tool_call_cut_off_before_its_name_ends_as_text() -> None:
    text = '{"name": "get_w'
    result = GenerateResult(id="r", text=text, finish_reason=FinishReason.LENGTH)
    out = events_of(CHAT_COMPLETIONS_URL, [chunk(0, text), result], tools=CallText)
    [last] = out[1:]
    assert last["choices"][0]["delta"] == {"content": text}
    assert last["choices"][0]["finish_reason"] == "length"


def test_an_auto_answer_streams_its_text_then_its_calls_in_the_model_s_format() -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    text = f"Let me look.<tool_call>\n{call}\n</tool_call>"
    result = GenerateResult(id="r", text=text, finish_reason=FinishReason.STOP)
    replies = [chunk(i, text[at : at + 9]) for i, at in enumerate(range(0, len(text), 9))]
    hermes = functools.partial(stream_for, "auto", "hermes")
    out = events_of(CHAT_COMPLETIONS_URL, [*replies, result], tools=hermes)
    deltas = [c["delta"] for e in out[1:] for c in e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert json.loads(arguments) == {"city": "Oslo"}
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_call_asked_with_the_legacy_functions_streams_as_function_call() -> None:
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    result = GenerateResult(id="r", text=text, finish_reason=FinishReason.STOP)
    replies = [chunk(0, text[:14]), chunk(1, text[14:40]), chunk(2, text[40:]), result]
    out = events_of(CHAT_COMPLETIONS_URL, replies, tools=CallText, functions=True)
    deltas = [c["delta"] for e in out[1:] for c in e["choices"]]
    assert all("tool_calls" not in d for d in deltas)
    pieces = [d["function_call"] for d in deltas if "function_call" in d]
    assert pieces[0]["name"] == "get_weather"
    assert all("name" not in p for p in pieces[1:])
    assert json.loads("".join(p["arguments"] for p in pieces)) == {"city": "Paris"}
    assert out[-1]["choices"][0]["finish_reason"] == "function_call"
