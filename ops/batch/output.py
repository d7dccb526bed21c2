"""The output file of a batch run: what it already answers, and appending whole lines to it.

The file is the run's only state. A rerun with the same output file reads it back to skip
every input line already answered (`read_answered`), so an interrupted run resumes. Lines are
appended with one `os.write` per group of results, never through a buffer that could flush
half a line; if a kill still left a partial last line, it is cut off before appending. The
writer holds an exclusive lock on the file, so two runs can never both append to it.
"""

from __future__ import annotations

import fcntl
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from messages.openai_batch import AnsweredLine, BatchOutputLine
from ops.batch.ids import Fingerprints
from ops.errors import BatchOutputBusy

_answered_decoder = msgspec.json.Decoder(AnsweredLine)
_encoder = msgspec.json.Encoder()


@dataclass
class Answered:
    """What an output file holds: what it answers and counts by outcome.

    `keys`: the `custom_id`s answered; `line_numbers`: the input lines answered without a
    usable `custom_id` (none, or a duplicate's), which are few.
    """

    keys: Fingerprints = field(default_factory=Fingerprints)
    line_numbers: set[int] = field(default_factory=set)
    lines: int = 0
    by_status: Counter[int] = field(default_factory=Counter)  # response.status_code
    line_errors: Counter[str] = field(default_factory=Counter)  # error.code of refused lines
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unreadable: int = 0  # lines that are not output lines (left alone, not counted)

    @property
    def ok(self) -> int:
        return self.by_status[200]

    @property
    def errors(self) -> int:
        return self.lines - self.ok

    def answers(self, custom_id: str | None, number: int) -> bool:
        """Whether input line `number` (with that `custom_id`, or None) is answered here."""
        return custom_id in self.keys if custom_id is not None else number in self.line_numbers

    def count(self, line: AnsweredLine) -> None:
        self.lines += 1
        if line.error is not None:
            self.line_errors[str(line.error.get("code"))] += 1
        if line.status_code is not None:
            self.by_status[line.status_code] += 1
            self.prompt_tokens += _usage(line, "prompt_tokens")
            self.completion_tokens += _usage(line, "completion_tokens")


def _usage(line: AnsweredLine, name: str) -> int:
    """A token count from a response body; 0 when the line was written by something else."""
    body = (line.response or {}).get("body")
    usage = body.get("usage") if isinstance(body, dict) else None
    count = usage.get(name) if isinstance(usage, dict) else None
    return count if isinstance(count, int) else 0


def read_answered(path: Path) -> Answered:
    """Scan an output file (missing: nothing answered) line by line, in bounded memory."""
    answered = Answered()
    if not path.exists():
        return answered
    with path.open("rb") as lines:
        for raw in lines:
            if not raw.endswith(b"\n"):
                break  # a partial last line: not an answer (OutputWriter cuts it off)
            line = _decode(raw)
            if line is None:
                answered.unreadable += 1
                continue
            if line.custom_id is not None:
                answered.keys.add(line.custom_id)
            elif line.line is not None:
                answered.line_numbers.add(line.line)
            else:
                answered.unreadable += 1
                continue
            answered.count(line)
    return answered


def _decode(raw: bytes) -> AnsweredLine | None:
    try:
        return _answered_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


class OutputWriter:
    """Appends output lines to a file; each `write` call lands whole or, if killed, is cut.

    Opening it locks the file (raising `BatchOutputBusy` when another run holds it) and mends
    its end: a partial last line is cut off, a whole one missing only its newline gets it.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise BatchOutputBusy(f"another `tokenmill batch run` is writing {path}") from None
        _mend_last_line(path)

    def write(self, lines: Iterable[BatchOutputLine]) -> None:
        data = b"".join(_encoder.encode(line) + b"\n" for line in lines)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def sync(self) -> None:
        """Make what was written survive a power loss too, not only a killed process."""
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


def _mend_last_line(path: Path) -> None:
    if path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            chunk = f.read(end - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        if end == size:
            return
        f.seek(end)
        last = _decode(f.read(size - end))
        if last is not None and (last.custom_id is not None or last.line is not None):
            f.seek(size)
            f.write(b"\n")  # a whole line that only lacks its newline (written by hand?)
        else:
            f.truncate(end)
