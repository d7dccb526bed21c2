"""Chunk assembly (actors.streaming.token_stream, .policy): when chunks are due, what text they
may show (never a partial character, never what could begin a stop string), and that they
add up to the result exactly. The tokenizer is SmolLM2's real one; the clock is a number."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from actors.streaming.detokenizer import REPLACEMENT
from actors.streaming.policy import StreamPolicy
from actors.streaming.token_stream import TokenStream, held_back, shown_text
from gpu.loading.gguf import read_gguf_header
from gpu.loading.tokenizer import Tokenizer
from gpu.logprobs import TokenLogprob
from messages.chunk import GenerateChunk
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.request import GenerateRequest
from messages.validation import check_request


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Tokenizer:
    return read_gguf_header(smollm2_path)[1]


def engine_text(tokenizer: Tokenizer, ids: Sequence[int], stop: Sequence[str]) -> str:
    """The result's text as the engine makes it: decoded, cut where a stop string begins."""
    text = tokenizer.decode(ids)
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return text[: min(hits)] if hits else text


def run_stream(
    tokenizer: Tokenizer, text: str, stop: Sequence[str] = (), every: int = 1
) -> tuple[list[GenerateChunk], str, list[int]]:
    """Feed `text`'s tokens one per step as the GPU actor does (until a stop string shows),
    taking a chunk whenever one is due; then finish with the engine's result."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TokenStream(
        "r1", "run1", tokenizer.decode, stop=stop, interval_tokens=every, interval_s=60.0
    )
    chunks, fed = [], []
    for now, token in enumerate(ids):
        stream.add(token)
        fed.append(token)
        if engine_text(tokenizer, fed, stop) != tokenizer.decode(fed):
            break  # the engine stops here: this step's tokens end with the result
        if stream.due(float(now)) and (chunk := stream.take(float(now))) is not None:
            chunks.append(chunk)
    final = engine_text(tokenizer, fed, stop)
    last = stream.finish(final, fed, float(len(ids)))
    return [*chunks, *([last] if last is not None else [])], final, fed


@pytest.mark.parametrize("every", [1, 3, 16])
def test_chunks_add_up_to_the_result_and_never_split_a_character(
    tokenizer: Tokenizer, every: int
) -> None:
    text = "Héllo wörld — 日本語 🤖🎉 naïve café, and more plain words after it."
    chunks, final, fed = run_stream(tokenizer, text, every=every)
    assert final == text
    assert "".join(c.text for c in chunks) == final
    assert [t for c in chunks for t in c.token_ids] == fed
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert {(c.id, c.run) for c in chunks} == {("r1", "run1")}
    for chunk in chunks:
        assert REPLACEMENT not in chunk.text
        chunk.text.encode()  # whole characters only (a lone surrogate would raise)
    if every == 1:
        assert len(chunks) > 10


@pytest.mark.parametrize(
    ("text", "stop"),
    [
        ("The answer is 42. END of the answer, never shown", ["END"]),
        ("Counting: one, two, three, four, five", [", four"]),
        ("Stop strings may overlap: abcabcabd here", ["abcabd", "zzz"]),
        ("A stop string that never comes", ["NEVER"]),
        ("Emoji stop 🤖🎉 then the rest", ["🎉"]),
    ],
)
def test_text_after_a_stop_string_is_never_streamed(
    tokenizer: Tokenizer, text: str, stop: list[str]
) -> None:
    chunks, final, _ = run_stream(tokenizer, text, stop=stop)
    assert "".join(c.text for c in chunks) == final
    streamed = ""
    for chunk in chunks[:-1]:  # what was shown before the result was known
        streamed += chunk.text
        assert final.startswith(streamed)
        assert not any(s in streamed for s in stop)


def test_what_could_begin_a_stop_string_waits_for_the_next_chunk() -> None:
    assert held_back("see you lat", ["later", "bye"]) == 3
    assert held_back("see you", ["later"]) == 0
    assert held_back("ends with b", ["bye", "abc"]) == 1
    assert held_back("anything", []) == 0
    assert shown_text("one two STOP three", ["STOP"]) == "one two "
    assert shown_text("one two ST", ["STOP"]) == "one two "
    assert shown_text("one two", ["STOP"]) == "one two"


def test_the_stop_token_ends_the_last_chunk_but_not_its_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Done here", add_special_tokens=False)
    eos = tokenizer.eos_token_ids[0]
    stream = TokenStream("r", "x", tokenizer.decode, interval_tokens=1, interval_s=0.0)
    chunks = []
    for token in ids:
        stream.add(token)
        if (chunk := stream.take(0.0)) is not None:
            chunks.append(chunk)
    stream.add(eos)
    last = stream.finish(tokenizer.decode([*ids, eos]), [*ids, eos], 1.0)
    assert last is not None and last.token_ids == [eos] and last.text == ""
    assert "".join(c.text for c in chunks) == "Done here"


def test_nothing_left_means_no_last_chunk(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("abc def", add_special_tokens=False)
    stream = TokenStream("r", "x", tokenizer.decode, interval_tokens=1, interval_s=0.0)
    for token in ids:
        stream.add(token)
    assert stream.take(0.0) is not None
    assert stream.finish("abc def", ids, 0.0) is None
    assert not stream.diverged


def test_a_result_that_does_not_extend_the_chunks_is_flagged(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("abc def", add_special_tokens=False)
    stream = TokenStream("r", "x", tokenizer.decode, interval_tokens=1, interval_s=0.0)
    for token in ids:
        stream.add(token)
    stream.take(0.0)
    assert stream.finish("something else", [*ids, 7], 1.0) == GenerateChunk(
        id="r", run="x", seq=1, token_ids=[7], text=""
    )
    assert stream.diverged


def fed(stream: TokenStream, n: int) -> None:
    for _ in range(n):
        stream.add(ord("a"))


def letters(ids: Sequence[int]) -> str:
    return "".join(chr(i) for i in ids)


def test_due_first_at_once_then_every_n_tokens_or_interval_never_under_the_floor() -> None:
    stream = TokenStream(
        "r", "x", letters, interval_tokens=4, interval_s=1.0, min_interval_s=0.1, started=10.0
    )
    assert not stream.due(10.5)  # nothing sampled yet
    fed(stream, 1)
    assert not stream.due(10.05)  # under the floor, even for the first
    assert stream.due(10.2)  # the first chunk: as soon as there is text
    assert stream.take(10.2) == GenerateChunk(id="r", run="x", seq=0, token_ids=[97], text="a")
    fed(stream, 3)
    assert not stream.due(10.5)  # 3 < 4 tokens, 0.3 s < 1 s
    fed(stream, 1)
    assert not stream.due(10.25)  # 4 tokens, but under the floor
    assert stream.due(10.35)
    assert stream.take(10.35) is not None
    fed(stream, 1)
    assert not stream.due(11.3)
    assert stream.due(11.36)  # one token, but the interval passed
    assert stream.take(11.36) == GenerateChunk(id="r", run="x", seq=2, token_ids=[97], text="a")


def test_the_policy_gives_the_request_its_own_intervals_or_the_workers() -> None:
    policy = StreamPolicy(interval_tokens=8, interval_ms=250.0, min_interval_ms=20.0)
    assert policy.intervals(GenerateRequest(id="a", stream=True)) == (8, 0.25, 0.02)
    own = GenerateRequest(id="b", stream=True, stream_interval_tokens=2, stream_interval_ms=0)
    assert policy.intervals(own) == (2, 0.0, 0.02)
    with pytest.raises(ValueError, match="interval_tokens"):
        StreamPolicy(interval_tokens=0)


@pytest.mark.parametrize(
    "fields",
    [
        {"stream_interval_tokens": 0},
        {"stream_interval_ms": -1.0},
        {"stream_interval_ms": float("nan")},
    ],
)
def test_intervals_a_request_may_not_ask_for(fields: dict[str, float]) -> None:
    request = GenerateRequest(id="a", prompt="hi", stream=True, **fields)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as refused:
        check_request(request)
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    check_request(GenerateRequest(id="b", prompt="hi", stream=True, stream_interval_ms=0))


def test_a_choice_s_chunks_carry_its_index_and_their_tokens_logprobs() -> None:
    stream = TokenStream(
        "r", "run", lambda ids: "".join(chr(97 + i) for i in ids), index=2,
        token_text=lambda t: chr(97 + t), interval_tokens=2, interval_s=60.0,
    )  # fmt: skip
    for token in (0, 1, 2):
        stream.add(token)
    stream.add_logprobs([TokenLogprob(-float(t), (t, 5), (-0.1, -2.0)) for t in (0, 1, 2)])
    first = stream.take(0.0)
    assert first is not None and first.index == 2 and first.token_ids == [0, 1, 2]
    assert first.logprobs is not None
    assert first.logprobs.tokens == ["a", "b", "c"]
    assert first.logprobs.token_logprobs == [0.0, -1.0, -2.0]
    assert first.logprobs.top_tokens == [["a", "f"], ["b", "f"], ["c", "f"]]
    stream.add(3)
    stream.add_logprobs([TokenLogprob(-3.0, (3,), (-3.0,))])
    last = stream.finish("abcd", [0, 1, 2, 3], 1.0)
    assert last is not None and last.logprobs is not None and last.logprobs.tokens == ["d"]


def test_without_logprobs_asked_a_chunk_carries_none() -> None:
    stream = TokenStream("r", "run", lambda ids: "x" * len(ids), interval_tokens=1, interval_s=0)
    stream.add(1)
    taken = stream.take(0.0)
    assert taken is not None and taken.logprobs is None and taken.index == 0
