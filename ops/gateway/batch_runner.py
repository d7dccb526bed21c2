"""`BatchRunner`: runs the gateway's batches through Kafka, resumes them, ends them.

    runner = BatchRunner(store, files, kafka, settings, results_topic)
    await runner.start()                       # resumes every unfinished batch in the folder
    record = runner.create(file_id, "/v1/chat/completions", "24h", metadata=None)
    runner.get(batch_id), runner.cancel(batch_id)

A batch runs as `tokenmill batch run` runs a file (`ops.batch.runner.run_batch`): its input
file in, its answers appended to its output (`BatchStore.output`), at most
`--batch-max-inflight` requests in flight, in bounded memory whatever its length. What the
output already answers is skipped, so a batch whose gateway was killed resumes when a gateway
starts again on the same `--batch-dir` (or, with a shared folder, when another instance's
sweep finds its lock free): each `custom_id` is answered once. Results come back on this
instance's batch reply topic.

The end: every line answered → `finalizing` → the output split into the output file (status
200) and the error file (the rest) → `completed`. A cancel, or the completion window passing,
stops the run as `batch cancel` does (the requests in flight are cancelled) and answers every
line never answered with a `batch_cancelled` / `batch_expired` error line → `cancelled` /
`expired`. As OpenAI's, a batch that reached `cancelling` ends `cancelled` even when every line
was answered before its run saw the cancel; the lines answered stay in the output file. A
Kafka failure pauses the run and retries it until the window ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiokafka.errors import KafkaError
from msgspec import structs

from actors.kafka.connection import KafkaConnection
from messages.openai_batch import SUPPORTED_URLS
from ops.batch.cancel import cancel_marker
from ops.batch.output import read_answered
from ops.batch.runner import BatchOptions, run_batch
from ops.errors import OpsError
from ops.gateway.batch_ending import finish
from ops.gateway.batches import BatchRecord, BatchStore, new_batch_id, window_seconds
from ops.gateway.errors import ApiError, not_found
from ops.gateway.files import FileStore
from ops.gateway.settings import GatewaySettings

log = structlog.get_logger("tokenmill.gateway")
SWEEP_S = 10.0  # how often unfinished batches no run holds are looked for
_WATCH_S = 0.5  # how often a running batch looks for a cancel or its deadline
_SAVE_EVERY_S = 1.0  # a running batch's counts are written at most this often
_RETRY_S = (2.0, 5.0, 15.0, 60.0)  # pauses after a failed run, then the last again


@dataclass
class _Job:
    record: BatchRecord
    saved: float = 0.0  # when the record was last written (monotonic)


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        kafka: KafkaConnection,
        settings: GatewaySettings,
        results_topic: str,
    ) -> None:
        self.store = store
        self.files = files
        self.kafka = kafka
        self.settings = settings
        self.results_topic = results_topic
        self._jobs: dict[str, _Job] = {}  # the batches this instance runs now
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(settings.batch_max_running)

    @property
    def running(self) -> int:
        return len(self._jobs)

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="gateway-batch-sweep")

    async def stop(self) -> None:
        """Stop every run here (each resumes at the next start); nothing is lost."""
        tasks = [t for t in (self._sweeper, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def create(
        self, input_file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None
    ) -> BatchRecord:
        """A new batch, `in_progress` (and running) or `failed` when its input cannot run as
        asked; `ApiError` 400 for arguments OpenAI's API refuses too."""
        if endpoint not in SUPPORTED_URLS:
            raise ApiError(
                400,
                f"endpoint {endpoint!r}: supported are {', '.join(SUPPORTED_URLS)}",
                code="invalid_endpoint",
                param="endpoint",
            )
        try:
            window_s = window_seconds(window)
        except ValueError as exc:
            raise ApiError(
                400, str(exc), code="invalid_completion_window", param="completion_window"
            ) from None
        stored = self.files.get(input_file_id)
        if stored is None or stored.purpose != "batch":
            raise ApiError(
                400,
                f"input_file_id {input_file_id!r} names no file uploaded for purpose batch",
                code="invalid_input_file",
                param="input_file_id",
            )
        now = int(time.time())
        record = BatchRecord(
            id=new_batch_id(),
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=window,
            window_s=window_s,
            created_at=now,
            expires_at=now + window_s,
            metadata=metadata,
        )
        record.request_counts.total = stored.lines
        if stored.urls != [endpoint]:  # every line must ask for the batch's endpoint
            record.status, record.failed_at = "failed", now
            record.errors = {
                "object": "list",
                "data": [
                    {
                        "code": "mismatched_endpoint",
                        "message": f"the file's lines ask for {', '.join(stored.urls)}, "
                        f"not only the batch's endpoint {endpoint}",
                        "param": "url",
                        "line": None,
                    }
                ],
            }
        else:
            record.status, record.in_progress_at = "in_progress", now
        self.store.save(record)
        if not record.final:
            self._launch(record.id)
        return record

    def get(self, batch_id: str) -> BatchRecord | None:
        job = self._jobs.get(batch_id)
        return job.record if job is not None else self.store.get(batch_id)

    def cancel(self, batch_id: str) -> BatchRecord:
        """Ask the batch to stop (whichever instance runs it); the record as it now stands."""
        record = self.get(batch_id)
        if record is None:
            raise not_found("batch", batch_id)
        if record.status in ("cancelling", "cancelled", "finalizing"):
            return record  # finalizing: every line is answered; it ends completed
        if record.final:
            raise ApiError(
                400,
                f"batch {batch_id} is {record.status}: only a running batch can be cancelled",
                code="invalid_state",
            )
        self.store.cancel_asked(batch_id).touch()
        job = self._jobs.get(batch_id)
        if job is not None:
            self._cancelling(job)  # its run sees it within `_WATCH_S`
            return job.record
        now = int(time.time())  # its run (here at the next sweep, or another instance's) ends it
        return structs.replace(record, status="cancelling", cancelling_at=now)

    def _launch(self, batch_id: str) -> None:
        if batch_id not in self._tasks:
            task = asyncio.create_task(self._own(batch_id), name=f"gateway-batch-{batch_id}")
            self._tasks[batch_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(batch_id, None))

    async def _sweep(self) -> None:
        while True:
            try:
                listed = await asyncio.to_thread(self.store.listed)
            except OSError as exc:  # the folder is unreadable now: look again later
                log.warning("gateway_batch_sweep_failed", error=repr(exc))
                listed = []
            for record in reversed(listed):  # the oldest first: slots go in creation order
                if not record.final:
                    self._launch(record.id)
            await asyncio.sleep(SWEEP_S)

    async def _own(self, batch_id: str) -> None:
        """Run the batch to its end in one of `--batch-max-running` slots, if no other run
        holds it."""
        async with self._slots:
            try:
                fd = self.store.lock(batch_id)
            except OSError as exc:
                log.error("gateway_batch_error", batch_id=batch_id, error=repr(exc))
                return
            if fd is None:
                return  # another instance runs it
            try:
                record = self.store.get(batch_id)  # read again, under the lock
                if record is None or record.final:
                    return
                job = self._jobs[batch_id] = _Job(record)
                log.info("gateway_batch_running", batch_id=batch_id,
                         total=record.request_counts.total)  # fmt: skip
                await self._run(job)
            except Exception as exc:  # a batch's failure must not stop the gateway
                log.error("gateway_batch_error", batch_id=batch_id, error=repr(exc))
            finally:
                self._jobs.pop(batch_id, None)
                os.close(fd)

    async def _run(self, job: _Job) -> None:
        if not self.files.path(job.record.input_file_id).exists():
            await self._end(job, "failed")  # deleted under it (another instance's DELETE)
            return
        failures = 0
        ending = "done" if job.record.status == "finalizing" else self._ending(job)
        while ending is None:
            try:
                if await self._run_once(job):
                    break  # every line answered
            except (OpsError, KafkaError, OSError) as exc:
                pause = _RETRY_S[min(failures, len(_RETRY_S) - 1)]
                failures += 1
                log.warning("gateway_batch_paused", batch_id=job.record.id, error=str(exc),
                            retry_in_s=pause)  # fmt: skip
                await self._pause(job, pause)
            ending = self._ending(job)
        if ending is None and self._cancel_asked(job):
            ending = "cancelled"  # it reached `cancelling`: it ends so, whatever was answered
        await self._end(job, None if ending == "done" else ending)

    async def _end(self, job: _Job, ending: str | None) -> None:
        """`finish` in a thread; the batch's lock is held until the thread is done, even when
        this task is cancelled (a stop), so no other run finishes it at the same time."""
        ended = asyncio.ensure_future(
            asyncio.to_thread(finish, self.store, self.files, job.record, ending)
        )
        try:
            record = await asyncio.shield(ended)
        except asyncio.CancelledError:
            await ended
            raise
        job.record = record
        counts = record.request_counts
        log.info("gateway_batch_ended", batch_id=record.id, status=record.status,
                 completed=counts.completed, failed=counts.failed)  # fmt: skip

    async def _run_once(self, job: _Job) -> bool:
        """One `run_batch` over what is unanswered; whether every line is now answered."""
        record = job.record
        output = self.store.output(record.id)
        answered = await asyncio.to_thread(read_answered, output)
        record.request_counts.completed = answered.ok
        record.request_counts.failed = answered.errors
        self._save(job)
        options = BatchOptions(
            input=self.files.path(record.input_file_id),
            output=output,
            kafka=self.kafka,
            topic=self.settings.requests_topic,
            results_topic=self.results_topic,
            max_inflight=self.settings.batch_max_inflight,
            default_max_tokens=self.settings.default_max_tokens,
            openai_defaults=True,  # the gateway's doors read omitted fields as OpenAI does
            stall_timeout_s=max(record.expires_at - time.time(), 0) + 60,
            cancel_topic=self.settings.cancel_topic,
        )
        watching = asyncio.create_task(self._watch(job, cancel_marker(output)))
        try:
            summary = await run_batch(options, _Counting(job, lambda: self._save(job)))
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            cancel_marker(output).unlink(missing_ok=True)
        return summary.complete and not summary.cancel_requested

    async def _watch(self, job: _Job, marker: Path) -> None:
        """Stop the run (`batch cancel`'s marker) once cancelled or past the window."""
        while True:
            self._stop_if_ending(job, marker)
            await asyncio.sleep(_WATCH_S)

    async def _pause(self, job: _Job, seconds: float) -> None:
        """Wait `seconds`, or less when the batch is cancelled or expires first."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if self._ending(job) is not None:
                return
            await asyncio.sleep(_WATCH_S)

    def _stop_if_ending(self, job: _Job, marker: Path) -> None:
        if self._ending(job) is not None:
            marker.touch()  # again if the run, as it started, removed an old one

    def _ending(self, job: _Job) -> str | None:
        """How the batch ends early: "cancelled", "expired", or None (it runs on)."""
        if self._cancel_asked(job):
            self._cancelling(job)
            return "cancelled"
        return "expired" if time.time() >= job.record.expires_at else None

    def _cancel_asked(self, job: _Job) -> bool:
        record = job.record
        return record.cancelling_at is not None or self.store.cancel_asked(record.id).exists()

    def _cancelling(self, job: _Job) -> None:
        if job.record.cancelling_at is None and job.record.status == "in_progress":
            job.record.status, job.record.cancelling_at = "cancelling", int(time.time())
            self._save(job)

    def _save(self, job: _Job) -> None:
        self.store.save(job.record)
        job.saved = time.monotonic()


class _Counting:
    """A run's `Progress`: the batch's request counts, written at most every second."""

    def __init__(self, job: _Job, save: Callable[[], None]) -> None:
        self._job = job
        self._save = save

    def started(self, total: int, already: int) -> None:
        pass  # the counts were read from the output before the run

    def answered(self, ok: bool, completion_tokens: int) -> None:
        counts = self._job.record.request_counts
        if ok:
            counts.completed += 1
        else:
            counts.failed += 1
        if time.monotonic() - self._job.saved > _SAVE_EVERY_S:
            self._save()

    def finished(self) -> None:
        self._save()
