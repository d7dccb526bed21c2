"""`run_batch`: stream an OpenAI Batch input file through Kafka into an output file.

    summary = asyncio.run(run_batch(BatchOptions(input, output, kafka), progress))

One pass over the input, in bounded memory whatever its length: a line is read only when
fewer than `max_inflight` requests are waiting for results; each result is appended to the
output as soon as it arrives. What the output file already answers is skipped, so a rerun
resumes an interrupted run; a kill loses only what was in flight. Every line gets exactly one
output line: a response, or an error line for a line that never became a request. The
decisions are `BatchPlan`'s (`ops/batch/plan.py`); this module does the I/O.
`tokenmill batch cancel` stops a run: see `ops/batch/cancel.py`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.errors import MessageSizeTooLargeError

from actors.config import DEFAULT_CANCEL_TOPIC, DEFAULT_REQUESTS_TOPIC, DEFAULT_RESULTS_TOPIC
from actors.kafka.connection import KafkaConnection
from messages.openai_batch import BatchOutputLine
from ops.batch.cancel import cancel_marker
from ops.batch.output import OutputWriter, read_answered
from ops.batch.plan import BatchPlan, InFlight
from ops.batch.progress import Progress
from ops.batch.summary import BatchSummary, count_lines, peak_rss_mb
from ops.cancel.client import CancelSender
from ops.errors import CancelError, SubmitError
from ops.submit.client import SubmitClient

_SYNC_EVERY_S = 5.0  # fsync the output this often: a power loss, too, loses only seconds


@dataclass(frozen=True)
class BatchOptions:
    input: Path
    output: Path
    kafka: KafkaConnection | str
    topic: str = DEFAULT_REQUESTS_TOPIC
    results_topic: str = DEFAULT_RESULTS_TOPIC
    max_inflight: int = 256  # requests sent and not yet answered
    model: str | None = None  # overrides every body's `model`
    default_max_tokens: int | None = None  # for bodies without max_tokens
    openai_defaults: bool = False  # omitted fields as OpenAI reads them (`to_request`)
    stall_timeout_s: float = 300.0  # give up when nothing is answered for this long
    cancel_topic: str = DEFAULT_CANCEL_TOPIC
    cancel_wait_s: float = 30.0  # after `batch cancel`: then what is unanswered is written


async def run_batch(options: BatchOptions, progress: Progress) -> BatchSummary:
    """Run (or resume) the batch; returns what it did.

    Raises `BatchOutputBusy` when another run holds the output file, `SubmitError` (or an
    aiokafka `KafkaError`) when Kafka cannot be reached or stops taking requests, `OSError`
    when a file cannot be read or written. Whatever it raises, a rerun resumes.
    """
    started = time.monotonic()
    summary = BatchSummary(input=str(options.input), output=str(options.output))
    writer = OutputWriter(options.output)  # first: it locks the file and mends its end
    cancel_marker(options.output).unlink(missing_ok=True)  # left by an earlier run's cancel
    try:
        # in threads: a long file takes seconds to read, and the loop may serve others
        answered = await asyncio.to_thread(read_answered, options.output)
        summary.total = await asyncio.to_thread(count_lines, options.input)
        plan = BatchPlan(
            answered=answered,
            progress=progress,
            summary=summary,
            max_inflight=options.max_inflight,
            results_topic=options.results_topic,
            model=options.model,
            default_max_tokens=options.default_max_tokens,
            openai_defaults=options.openai_defaults,
        )
        async with SubmitClient(options.kafka, options.topic, options.results_topic) as client:
            await client.listen()
            progress.started(summary.total, answered.lines)
            try:
                await _feed_and_collect(_Run(options, plan, client, writer))
            finally:
                progress.finished()
                summary.in_flight = len(plan.pending)
    finally:
        writer.close()
        summary.wall_s = time.monotonic() - started
        summary.peak_rss_mb = peak_rss_mb()
    return summary


@dataclass
class _Run:
    options: BatchOptions
    plan: BatchPlan
    client: SubmitClient
    writer: OutputWriter
    fed: bool = False
    # (request id, why): records the broker refused as too large, to answer with error lines
    too_large: list[tuple[str, BaseException]] = field(default_factory=list)
    send_error: BaseException | None = None
    feeding: asyncio.Task[None] | None = None
    cancel_deadline: float | None = None  # cancelling: when the unanswered are written

    async def send(self, sending: InFlight) -> None:
        self.plan.track(sending)
        request_id = sending.request.id
        try:
            acked = await self.client.send_one(sending.request)
        except MessageSizeTooLargeError as exc:  # the producer's own size check
            self.writer.write([self.plan.unsendable(request_id, exc)])
            return
        acked.add_done_callback(functools.partial(self._acked, request_id))

    def _acked(self, request_id: str, future: asyncio.Future[object]) -> None:
        if future.cancelled() or (error := future.exception()) is None:
            return
        if isinstance(error, MessageSizeTooLargeError):  # the broker's: this record only
            self.too_large.append((request_id, error))
        else:
            self.send_error = self.send_error or error


async def _feed_and_collect(run: _Run) -> None:
    try:
        async with asyncio.TaskGroup() as tasks:
            run.feeding = tasks.create_task(_feed(run))
            await _collect(run)
            run.feeding.cancel()  # only still running when collecting stalled
    except ExceptionGroup as group:
        raise _first_error(group) from None  # one plain error for the CLI to explain


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_error(first) if isinstance(first, BaseExceptionGroup) else first


async def _feed(run: _Run) -> None:
    try:
        for number, raw in _input_lines(run.options.input):
            planned = run.plan.plan(number, raw)
            if isinstance(planned, BatchOutputLine):
                run.writer.write([planned])
            elif isinstance(planned, InFlight):
                await run.plan.window.acquire()
                await run.send(planned)
            if number % 512 == 0:
                await asyncio.sleep(0)  # let results in while a long stretch is skipped
    finally:
        run.fed = True


async def _collect(run: _Run) -> None:
    plan, writer = run.plan, run.writer
    last_answer = last_sync = time.monotonic()
    while not (run.fed and not plan.pending):
        if run.send_error is not None:
            raise SubmitError(f"a request could not be sent: {run.send_error}")
        lines = [plan.unsendable(request_id, why) for request_id, why in run.too_large]
        run.too_large.clear()
        if run.cancel_deadline is None and cancel_marker(run.options.output).exists():
            await _cancel(run)
        elif run.cancel_deadline is not None and time.monotonic() > run.cancel_deadline:
            lines += [plan.abandoned(request_id) for request_id in list(plan.pending)]
        for result in await run.client.poll(0.2):
            settled = plan.settle(result)
            if isinstance(settled, InFlight):
                await run.send(settled)  # again, in the same window slot
            elif settled is not None:
                lines.append(settled)
        now = time.monotonic()
        if lines:
            writer.write(lines)
            last_answer = now
            if now - last_sync > _SYNC_EVERY_S:
                writer.sync()
                last_sync = now
        elif not plan.pending:
            last_answer = now
        elif now - last_answer > run.options.stall_timeout_s:
            plan.summary.stalled = True
            return


async def _cancel(run: _Run) -> None:
    """`batch cancel` asked: stop feeding, cancel every request in flight."""
    plan = run.plan
    plan.cancelling = plan.summary.cancel_requested = True
    if run.feeding is not None:
        run.feeding.cancel()
    run.cancel_deadline = time.monotonic() + run.options.cancel_wait_s
    try:
        async with CancelSender(run.options.kafka, run.options.cancel_topic) as sender:
            await sender.cancel(list(plan.pending), reason="batch cancel")
    except CancelError as exc:
        raise SubmitError(f"cannot cancel the requests in flight: {exc}") from exc


def _input_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if raw.strip():
                yield number, raw
