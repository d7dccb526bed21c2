"""A consumer's rebuilding of streamed text (ops.submit.assembly): in `seq` order, duplicates
dropped, gaps waited for, a new run starting over, the result having the last word."""

from __future__ import annotations

from messages.chunk import GenerateChunk
from messages.result import FinishReason, GenerateResult
from ops.submit.assembly import StreamedText


def chunk(seq: int, text: str, run: str = "a") -> GenerateChunk:
    return GenerateChunk(id="r", run=run, seq=seq, token_ids=[seq], text=text)


def result(text: str) -> GenerateResult:
    return GenerateResult(id="r", text=text, finish_reason=FinishReason.STOP)


def test_in_order_with_duplicates_and_a_gap() -> None:
    text = StreamedText()
    assert text.add(chunk(0, "Hel")) == "Hel"
    assert text.add(chunk(0, "Hel")) == ""  # sent twice
    assert text.add(chunk(2, " wor")) == ""  # 1 is not in yet
    assert text.add(chunk(1, "lo")) == "lo wor"
    assert text.add(chunk(2, " wor")) == ""
    assert text.add(chunk(3, "ld")) == "ld"
    assert text.shown == "Hello world"
    assert text.finish(result("Hello world")) == ""
    assert text.finish(result("Hello world!")) == "!"


def test_a_new_run_starts_over_and_the_result_is_shown_whole() -> None:
    text = StreamedText()
    text.add(chunk(0, "first try"))
    assert text.add(chunk(0, "second", run="b")) == "second"
    assert text.restarted
    assert text.add(chunk(1, " try", run="b")) == " try"
    assert text.finish(result("second try")) is None


def test_a_result_that_does_not_begin_with_the_shown_text() -> None:
    text = StreamedText()
    text.add(chunk(0, "abc"))
    assert text.finish(result("xyz")) is None


def test_no_chunks_at_all() -> None:
    assert StreamedText().finish(result("all of it")) == "all of it"
