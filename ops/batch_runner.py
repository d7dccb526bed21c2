"""`run_batch`: stream an OpenAI Batch input file through Kafka into an output file.

    summary = asyncio.run(run_batch(BatchOptions(input, output, bootstrap), progress))

One pass over the input, in bounded memory whatever its length: a line is read only when
fewer than `max_inflight` requests are waiting for results; each result is appended to the
output as soon as it arrives. What the output file already answers is skipped, so a rerun
resumes an interrupted run; a kill loses only what was in flight. Every line gets exactly one
output line: a response, or an error line for a line that never became a request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from aiokafka.errors import MessageSizeTooLargeError

from actors.config import DEFAULT_REQUESTS_TOPIC, DEFAULT_RESULTS_TOPIC
from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import BatchOutputLine
from messages.openai_batch_mapping import (
    LineCode,
    answer_line,
    parse_line,
    refusal_line,
    to_request,
)
from messages.request import GenerateRequest
from messages.result import GenerateResult
from ops.batch_ids import Fingerprints
from ops.batch_output import Answered, OutputWriter, line_key, read_answered
from ops.errors import SubmitError
from ops.submit_client import SubmitClient

_SYNC_EVERY_S = 5.0  # fsync the output this often: a power loss, too, loses only seconds


@dataclass(frozen=True)
class BatchOptions:
    input: Path
    output: Path
    bootstrap: str
    topic: str = DEFAULT_REQUESTS_TOPIC
    results_topic: str = DEFAULT_RESULTS_TOPIC
    max_inflight: int = 256  # requests sent and not yet answered
    model: str | None = None  # overrides every body's `model`
    default_max_tokens: int | None = None  # for bodies without max_tokens
    stall_timeout_s: float = 300.0  # give up when nothing is answered for this long


class Progress(Protocol):
    def started(self, total: int, already: int) -> None: ...
    def answered(self, ok: bool, completion_tokens: int) -> None: ...
    def finished(self) -> None: ...


@dataclass
class BatchSummary:
    """What one `batch run` did. `complete`: every input line has its output line."""

    input: str
    output: str
    total: int = 0  # non-blank input lines
    already: int = 0  # answered by an earlier run (skipped)
    sent: int = 0
    ok: int = 0  # status 200
    refused: int = 0  # the worker answered with an error (non-200 response)
    line_errors: int = 0  # lines that never became requests
    errors_by_code: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_flight: int = 0  # sent and unanswered when the run ended
    wall_s: float = 0.0
    stalled: bool = False
    peak_rss_mb: float | None = None  # this process's high-water mark (Linux)

    @property
    def answered(self) -> int:
        return self.ok + self.refused + self.line_errors

    @property
    def complete(self) -> bool:
        return self.already + self.answered >= self.total and not self.in_flight

    def as_json(self) -> dict[str, object]:
        wall = max(self.wall_s, 1e-9)
        return {
            "input": self.input,
            "output": self.output,
            "complete": self.complete,
            "total_lines": self.total,
            "already_answered": self.already,
            "answered": self.answered,
            "ok": self.ok,
            "refused": self.refused,
            "line_errors": self.line_errors,
            "errors_by_code": dict(sorted(self.errors_by_code.items())),
            "in_flight_at_end": self.in_flight,
            "stalled": self.stalled,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "wall_s": round(self.wall_s, 3),
            "requests_per_s": round(self.answered / wall, 2),
            "completion_tokens_per_s": round(self.completion_tokens / wall, 2),
            "peak_rss_mb": self.peak_rss_mb,
        }


def peak_rss_mb() -> float | None:
    """This process's peak resident memory (VmHWM), or None where /proc does not say.

    Not `getrusage`: Linux carries a forked parent's high-water mark across `exec` into it.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def count_lines(path: Path) -> int:
    """Non-blank lines of `path`, read in bounded memory."""
    with path.open("rb") as lines:
        return sum(1 for raw in lines if raw.strip())


@dataclass(frozen=True)
class _Pending:
    custom_id: str
    url: str


@dataclass(frozen=True)
class _Send:
    request: GenerateRequest
    answers: _Pending


class _Run:
    """The state of one run: what is in flight, what was seen, the counts so far."""

    def __init__(self, options: BatchOptions, answered: Answered, progress: Progress) -> None:
        self.options = options
        self.answered = answered
        self.progress = progress
        self.summary = BatchSummary(input=str(options.input), output=str(options.output))
        self.seen = Fingerprints()  # custom_ids read so far, to refuse duplicates
        self.pending: dict[str, _Pending] = {}  # request id → what it answers
        self.window = asyncio.Semaphore(options.max_inflight)
        self.tag = uuid.uuid4().hex[:8]  # request ids differ between runs of the same file
        self.fed = False
        self.delivery_error: BaseException | None = None

    def plan(self, number: int, raw: bytes) -> _Send | BatchOutputLine | None:
        """What to do with input line `number`: a request to send, an error line, or skip."""
        refused: BatchLineRefused | None = None
        try:
            line = parse_line(raw)
            custom_id: str | None = line.custom_id
        except BatchLineRefused as exc:
            refused, custom_id = exc, exc.custom_id
        if custom_id is not None and not self.seen.add(custom_id):
            refused = BatchLineRefused(
                LineCode.DUPLICATE_CUSTOM_ID,
                f"custom_id {custom_id!r} appears on an earlier line",
                param="custom_id",
            )
            custom_id = None
        if (custom_id or line_key(number)) in self.answered.keys:
            self.summary.already += 1
            return None
        if refused is None:
            try:
                request = to_request(
                    line,
                    f"batch-{self.tag}-{number}",
                    model=self.options.model,
                    default_max_tokens=self.options.default_max_tokens,
                )
                request.reply_to = self.options.results_topic  # whatever the worker's default
                return _Send(request, _Pending(line.custom_id, line.url))
            except BatchLineRefused as exc:
                refused = exc
        return self._refusal(refused, number)

    def settle(self, result: GenerateResult) -> BatchOutputLine | None:
        """The output line for `result` if it answers one of ours still in flight."""
        pending = self.pending.pop(result.id, None)
        if pending is None:
            return None  # someone else's, or a second answer to the same request
        self.window.release()
        summary = self.summary
        if result.error is None:
            summary.ok += 1
        else:
            summary.refused += 1
            summary.errors_by_code[str(result.error.code)] += 1
        summary.prompt_tokens += result.usage.prompt_tokens
        summary.completion_tokens += result.usage.completion_tokens
        self.progress.answered(result.error is None, result.usage.completion_tokens)
        return answer_line(pending.custom_id, pending.url, result)

    def unsendable(self, number: int, send: _Send, reason: Exception) -> BatchOutputLine:
        """The error line for a request the producer refused to send (larger than it allows)."""
        del self.pending[send.request.id]
        self.window.release()
        refused = BatchLineRefused(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"the request is larger than the producer sends ({reason})",
            custom_id=send.answers.custom_id,
        )
        return self._refusal(refused, number)

    def _refusal(self, refused: BatchLineRefused, number: int) -> BatchOutputLine:
        self.summary.line_errors += 1
        self.summary.errors_by_code[str(refused.code)] += 1
        self.progress.answered(False, 0)
        return refusal_line(refused, line_number=number)

    def on_delivery(self, future: asyncio.Future[object]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.delivery_error = self.delivery_error or future.exception()


async def run_batch(options: BatchOptions, progress: Progress) -> BatchSummary:
    """Run (or resume) the batch; returns what it did. Raises `SubmitError` when Kafka's
    topics cannot be reached or a request cannot be sent."""
    started = time.monotonic()
    answered = read_answered(options.output)
    run = _Run(options, answered, progress)
    run.summary.total = count_lines(options.input)
    progress.started(run.summary.total, answered.lines)
    writer = OutputWriter(options.output)
    try:
        async with SubmitClient(options.bootstrap, options.topic, options.results_topic) as client:
            await client.listen()
            async with asyncio.TaskGroup() as tasks:
                feeding = tasks.create_task(_feed(run, client, writer))
                await _collect(run, client, writer)
                feeding.cancel()  # only still running when collecting stalled
    finally:
        writer.close()
        progress.finished()
        run.summary.in_flight = len(run.pending)
        run.summary.wall_s = time.monotonic() - started
        run.summary.peak_rss_mb = peak_rss_mb()
    return run.summary


async def _feed(run: _Run, client: SubmitClient, writer: OutputWriter) -> None:
    try:
        for number, raw in _input_lines(run.options.input):
            planned = run.plan(number, raw)
            if isinstance(planned, BatchOutputLine):
                writer.write([planned])
            elif isinstance(planned, _Send):
                await run.window.acquire()
                run.pending[planned.request.id] = planned.answers
                try:
                    sent = await client.send_one(planned.request)
                except MessageSizeTooLargeError as exc:
                    writer.write([run.unsendable(number, planned, exc)])
                    continue
                sent.add_done_callback(run.on_delivery)
                run.summary.sent += 1
            if number % 512 == 0:
                await asyncio.sleep(0)  # let results in while a long stretch is skipped
    finally:
        run.fed = True


async def _collect(run: _Run, client: SubmitClient, writer: OutputWriter) -> None:
    last_answer = last_sync = time.monotonic()
    while not (run.fed and not run.pending):
        if run.delivery_error is not None:
            raise SubmitError(f"a request could not be sent: {run.delivery_error}")
        settled = [line for r in await client.poll(0.2) if (line := run.settle(r)) is not None]
        now = time.monotonic()
        if settled:
            writer.write(settled)
            last_answer = now
            if now - last_sync > _SYNC_EVERY_S:
                writer.sync()
                last_sync = now
        elif not run.pending:
            last_answer = now
        elif now - last_answer > run.options.stall_timeout_s:
            run.summary.stalled = True
            return


def _input_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if raw.strip():
                yield number, raw
