"""How a gateway batch ends: every line answered, the output split in two, the record final.

    record = finish(store, files, record, ending=None | "cancelled" | "expired")

Run under the batch's lock, after its run stopped. Each step can be done again (a gateway
killed while finishing finishes at its next start): lines never answered get one error line
each (`batch_cancelled` / `batch_expired`), appended to the run's output only when missing;
the output is then read once and split into the output file (responses with status 200) and
the error file (every other line), whose ids derive from the batch's, so a second split
replaces the first. Memory stays bounded: one line at a time.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from messages.errors import BatchLineRefused
from messages.openai_batch import AnsweredLine
from messages.openai_batch_answers import refusal_line
from messages.openai_batch_mapping import parse_line
from ops.batch.output import OutputWriter, read_answered
from ops.gateway.batches import BatchRecord, BatchStore
from ops.gateway.files import FileStore

_decoder = msgspec.json.Decoder(AnsweredLine)
_WRITE_EVERY = 1024  # unanswered lines appended per write


def finish(
    store: BatchStore, files: FileStore, record: BatchRecord, ending: str | None
) -> BatchRecord:
    """End a copy of `record`: `completed`, or `ending` ("cancelled" / "expired") for a run
    stopped early, or "failed" for one whose input is gone. Returns it (also saved); once it
    is saved, the run's output (now split in two) is removed."""
    record = copy.deepcopy(record)  # the caller's stays as it was until this returns
    now = int(time.time())
    output = store.output(record.id)
    if ending == "failed":
        record.status, record.failed_at = "failed", now
        record.errors = {"object": "list", "data": [{
            "code": "input_file_missing", "param": "input_file_id", "line": None,
            "message": f"the input file {record.input_file_id} was deleted while the batch ran",
        }]}  # fmt: skip
        store.save(record)
        return record
    if ending is None:
        record.status, record.finalizing_at = "finalizing", record.finalizing_at or now
        store.save(record)
    else:
        _answer_the_rest(files.path(record.input_file_id), output, f"batch_{ending}")
    ok, errors, usage = _split(output, files, record.id, ending)
    counts = record.request_counts
    counts.completed, counts.failed = ok.lines, errors.lines
    record.output_file_id = ok.file_id
    record.error_file_id = errors.file_id
    record.usage = usage
    now = int(time.time())
    if ending == "cancelled":
        record.status, record.cancelled_at = "cancelled", now
    elif ending == "expired":
        record.status, record.expired_at = "expired", now
    else:
        record.status, record.completed_at = "completed", now
    store.save(record)
    store.cancel_asked(record.id).unlink(missing_ok=True)
    output.unlink(missing_ok=True)
    return record


def _answer_the_rest(input_path: Path, output: Path, code: str) -> None:
    """An error line for each input line the output does not answer."""
    writer = OutputWriter(output)  # locks the output and mends a partial last line
    try:
        answered = read_answered(output)
        why = "the batch was cancelled" if code == "batch_cancelled" else "the batch expired"
        pending = []
        with input_path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                try:
                    custom_id: str | None = parse_line(raw).custom_id
                except BatchLineRefused as exc:
                    custom_id = exc.custom_id
                if answered.answers(custom_id, number):
                    continue
                refused = BatchLineRefused(code, f"not run: {why}", custom_id=custom_id)
                pending.append(refusal_line(refused, line_number=number))
                if len(pending) >= _WRITE_EVERY:
                    writer.write(pending)
                    pending.clear()
        writer.write(pending)
    finally:
        writer.close()


class _Part:
    """One of the two files a batch's output is split into."""

    def __init__(self, files: FileStore, file_id: str, filename: str) -> None:
        self.files = files
        self.file_id: str | None = file_id
        self.filename = filename
        self.partial = files.root / f"{file_id}.split"
        self.out = self.partial.open("wb")
        self.lines = 0

    def add(self, raw: bytes) -> None:
        self.out.write(raw)
        self.lines += 1

    def close(self, *, keep: bool = True) -> None:
        if keep:
            self.out.flush()
            os.fsync(self.out.fileno())
        self.out.close()
        assert self.file_id is not None
        if keep and self.lines:
            self.files.adopt(self.file_id, self.partial, self.filename, "batch_output")
        else:
            self.partial.unlink(missing_ok=True)
            self.file_id = None  # as OpenAI's: no file when no line would be in it


def _split(
    output: Path, files: FileStore, batch_id: str, ending: str | None
) -> tuple[_Part, _Part, dict[str, Any]]:
    """Status 200 to the output file, the rest to the error file; a run stopped early also
    sends there the answers its stop cut short (finish reason `cancelled`), marked with
    `batch_<ending>`, as OpenAI's error file holds the requests a stop left unfinished."""
    stem = batch_id.removeprefix("batch_")
    ok = _Part(files, f"file-{stem}-output", f"{batch_id}_output.jsonl")
    errors = _Part(files, f"file-{stem}-errors", f"{batch_id}_errors.jsonl")
    usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    if not output.exists():
        output.touch()  # a batch cancelled before its run wrote anything
    kept = False
    try:
        with output.open("rb") as lines:
            for raw in lines:
                if not raw.endswith(b"\n"):
                    break  # a partial last line is no answer (the run's writer cuts it)
                try:
                    line = _decoder.decode(raw)
                except msgspec.DecodeError:
                    continue  # not an answer: no run of ours wrote it
                body = (line.response or {}).get("body")
                if line.status_code != 200:
                    errors.add(raw)
                elif ending is not None and _cut_short(body):
                    errors.add(_marked(raw, f"batch_{ending}"))
                else:
                    ok.add(raw)
                used = body.get("usage") if isinstance(body, dict) else None
                if isinstance(used, dict):
                    usage["input_tokens"] += _count(used.get("prompt_tokens"))
                    usage["output_tokens"] += _count(used.get("completion_tokens"))
        kept = True
    finally:
        ok.close(keep=kept)
        errors.close(keep=kept)
    usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    details = {"input_tokens_details": {"cached_tokens": 0},
               "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    return ok, errors, usage | details


def _cut_short(body: Any) -> bool:
    """Whether a choice was cancelled: tokenmill's finish reason, in its own field (an
    output written before answers spoke OpenAI's finish reasons only: in `finish_reason`)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    return isinstance(choices, list) and any(
        isinstance(c, dict) and _own_finish(c) == "cancelled" for c in choices
    )


def _own_finish(choice: dict[str, Any]) -> object:
    note = choice.get("tokenmill")
    return note.get("finish_reason") if isinstance(note, dict) else choice.get("finish_reason")


def _marked(raw: bytes, code: str) -> bytes:
    """The answer line with an `error` saying the batch's stop cut it short (its response,
    with the tokens made, is kept)."""
    line = msgspec.json.decode(raw)
    why = "cancelled" if code == "batch_cancelled" else "expired"
    line["error"] = {"code": code, "message": f"cut short: the batch {why} while it ran"}
    return msgspec.json.encode(line) + b"\n"


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0
