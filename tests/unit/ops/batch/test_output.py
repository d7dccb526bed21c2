"""The batch output file: OutputWriter appends whole lines; read_answered reads them back.

A rerun resumes from this file alone, so it must count what it answers (by outcome, with
tokens), key every answered input line, skip what is not an output line, and never be left
with half a line to append after.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import (
    CHAT_COMPLETIONS_URL,
    COMPLETIONS_URL,
    AnsweredLine,
    BatchOutputLine,
)
from messages.openai_batch_answers import answer_line, refusal_line
from messages.openai_batch_mapping import LineCode
from messages.result import ErrorInfo, FinishReason, GenerateResult, ModelRef, Usage
from ops.batch.output import OutputWriter, read_answered
from ops.errors import BatchOutputBusy

MODEL = ModelRef(name="smollm2-135m", digest="sha256:" + "cd" * 32)


def ok(custom_id: str, prompt_tokens: int = 3, completion_tokens: int = 5) -> BatchOutputLine:
    usage = Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
    result = GenerateResult(
        id=f"req-{custom_id}",
        text="answer",
        finish_reason=FinishReason.STOP,
        usage=usage,
        model=MODEL,
    )
    return answer_line(custom_id, CHAT_COMPLETIONS_URL, result)


def failed(custom_id: str, code: ErrorCode) -> BatchOutputLine:
    result = GenerateResult(id=f"req-{custom_id}", error=ErrorInfo(code=code, message="no"))
    return answer_line(custom_id, COMPLETIONS_URL, result)


def refused(code: LineCode, number: int, custom_id: str | None = None) -> BatchOutputLine:
    return refusal_line(BatchLineRefused(code, "bad line", custom_id=custom_id), line_number=number)


def write(path: Path, lines: list[BatchOutputLine]) -> None:
    writer = OutputWriter(path)
    try:
        writer.write(lines)
    finally:
        writer.close()


def read_lines(path: Path) -> list[AnsweredLine]:
    """Every line of `path`, each of which must be a whole output line."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [msgspec.json.decode(raw, type=AnsweredLine) for raw in data.splitlines()]


# --- OutputWriter ---------------------------------------------------------------------------


def test_the_writer_writes_one_whole_json_line_per_output_line(tmp_path: Path) -> None:
    path = tmp_path / "out" / "batch.jsonl"  # the folder is created
    write(path, [ok("a"), refused(LineCode.INVALID_JSON, 2)])
    lines = read_lines(path)
    assert [(line.custom_id, line.status_code, line.line) for line in lines] == [
        ("a", 200, None),
        (None, None, 2),
    ]


def test_a_second_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(path, [ok("a"), ok("b")])
    write(path, [ok("c")])
    assert [line.custom_id for line in read_lines(path)] == ["a", "b", "c"]


def test_writes_of_one_writer_accumulate_and_close_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    writer = OutputWriter(path)
    writer.write([ok("a")])
    writer.write([])
    writer.write([ok("b"), ok("c")])
    writer.sync()
    writer.close()
    writer.close()
    assert [line.custom_id for line in read_lines(path)] == ["a", "b", "c"]


# --- read_answered: counts and keys ---------------------------------------------------------


def test_a_missing_file_answers_nothing(tmp_path: Path) -> None:
    answered = read_answered(tmp_path / "nope.jsonl")
    assert (answered.lines, answered.ok, answered.errors, answered.unreadable) == (0, 0, 0, 0)
    assert len(answered.keys) == 0


def test_an_empty_file_answers_nothing(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.touch()
    assert read_answered(path).lines == 0


def test_read_answered_counts_by_outcome_and_sums_tokens(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(
        path,
        [
            ok("a", prompt_tokens=3, completion_tokens=5),
            ok("b", prompt_tokens=2, completion_tokens=4),
            failed("c", ErrorCode.UNKNOWN_MODEL),
            failed("d", ErrorCode.SHUTTING_DOWN),
            failed("e", ErrorCode.SHUTTING_DOWN),
            refused(LineCode.INVALID_JSON, 7),
            refused(LineCode.UNSUPPORTED_URL, 8, custom_id="u"),
        ],
    )
    answered = read_answered(path)
    assert (answered.lines, answered.ok, answered.errors, answered.unreadable) == (7, 2, 5, 0)
    assert answered.by_status == {200: 2, 404: 1, 503: 2}
    assert answered.line_errors == {"invalid_json": 1, "unsupported_url": 1}
    assert (answered.prompt_tokens, answered.completion_tokens) == (5, 9)


def test_answered_lines_are_keyed_by_custom_id_or_line_number(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(
        path,
        [
            ok("a"),
            failed("c", ErrorCode.ENGINE_ERROR),
            refused(LineCode.UNSUPPORTED_URL, 3, custom_id="u"),
            refused(LineCode.DUPLICATE_CUSTOM_ID, 4),
        ],
    )
    answered = read_answered(path)
    assert len(answered.keys) == 3
    assert all(key in answered.keys for key in ["a", "c", "u"])
    assert answered.line_numbers == {4}, "a refused line with a custom_id is keyed by it"
    assert "4" not in answered.keys
    assert "b" not in answered.keys
    assert answered.answers(None, 4) and answered.answers("a", 9)
    assert not answered.answers(None, 3) and not answered.answers("b", 4)


def test_line_numbers_cannot_collide_with_custom_ids(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(path, [refused(LineCode.INVALID_JSON, 3)])
    answered = read_answered(path)
    assert not answered.answers("\x00line:3", 9) and not answered.answers("3", 9)


def test_a_second_writer_on_the_same_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    first = OutputWriter(path)
    with pytest.raises(BatchOutputBusy, match="another `tokenmill batch run`"):
        OutputWriter(path)
    first.close()
    OutputWriter(path).close()  # free again once the first is closed


def test_a_deeply_nested_line_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"[" * 5000 + b"\n" + msgspec.json.encode(ok("a")) + b"\n")
    answered = read_answered(path)
    assert (answered.lines, answered.unreadable) == (1, 1)


# --- read_answered and OutputWriter: damaged files ------------------------------------------


def test_a_partial_last_line_is_not_an_answer(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(path, [ok("a"), ok("b")])
    whole = msgspec.json.encode(ok("cut"))
    with path.open("ab") as f:
        f.write(whole[: len(whole) // 2])  # killed mid-write
    answered = read_answered(path)
    assert (answered.lines, answered.unreadable) == (2, 0)
    assert "cut" not in answered.keys


def test_a_complete_last_line_without_newline_is_not_an_answer_either(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(msgspec.json.encode(ok("a")) + b"\n" + msgspec.json.encode(ok("b")))
    answered = read_answered(path)
    assert answered.lines == 1
    assert "b" not in answered.keys


def test_a_writer_gives_a_whole_last_line_its_newline_instead_of_cutting_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(msgspec.json.encode(ok("a")) + b"\n" + msgspec.json.encode(ok("b")))
    write(path, [ok("c")])
    assert [line.custom_id for line in read_lines(path)] == ["a", "b", "c"]


def test_a_new_writer_cuts_a_partial_last_line_off(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(path, [ok("a"), ok("b")])
    with path.open("ab") as f:
        f.write(b'{"id": "batch_req_x", "custom_id": "tr')
    write(path, [ok("c")])
    assert [line.custom_id for line in read_lines(path)] == ["a", "b", "c"]
    assert read_answered(path).lines == 3


def test_a_file_holding_only_a_partial_line_is_emptied_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b'{"id": "batch_req_x", "cus')
    write(path, [ok("a")])
    assert [line.custom_id for line in read_lines(path)] == ["a"]


def test_a_long_partial_last_line_is_cut_whole(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(path, [ok("a")])
    with path.open("ab") as f:
        f.write(b'{"custom_id": "' + b"x" * 200_000)  # longer than one backwards read
    write(path, [ok("b")])
    assert [line.custom_id for line in read_lines(path)] == ["a", "b"]


def test_a_writer_leaves_a_file_of_whole_lines_alone(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    write(path, [ok("a"), ok("b")])
    before = path.read_bytes()
    OutputWriter(path).close()
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "garbage",
    [
        b"garbage",
        b"[1, 2, 3]",
        b'{"custom_id": 5}',
        b'{"id": "batch_req_x"}',  # neither a custom_id nor an error line number
        b'{"error": {"code": "invalid_json", "line": "seven"}}',
        b'{"custom_id": "z", "error": "boom"}',
    ],
)
def test_a_garbage_middle_line_is_counted_unreadable_and_skipped(
    tmp_path: Path, garbage: bytes
) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(
        msgspec.json.encode(ok("a"))
        + b"\n"
        + garbage
        + b"\n"
        + msgspec.json.encode(ok("b"))
        + b"\n"
    )
    answered = read_answered(path)
    assert (answered.lines, answered.ok, answered.unreadable) == (2, 2, 1)
    assert len(answered.keys) == 2
    assert "a" in answered.keys
    assert "b" in answered.keys


@pytest.mark.parametrize(
    "garbage",
    [
        b'{"custom_id": "z", "response": {"status_code": 200, "body": "oops"}}',
        b'{"custom_id": "z", "response": {"status_code": 200, '
        b'"body": {"usage": {"prompt_tokens": null}}}}',
    ],
    ids=["body-a-string", "usage-tokens-null"],
)
def test_a_line_with_a_malformed_response_body_does_not_stop_the_resume(
    tmp_path: Path, garbage: bytes
) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(msgspec.json.encode(ok("a")) + b"\n" + garbage + b"\n")
    assert "a" in read_answered(path).keys
