"""Hands the worker's finished span records to a span export process, never waiting for it.

    sink = SpanSink(
        [sys.executable, "-m", "actors.telemetry.span_export", "--service", "tokenmill"]
    )
    sink.start()
    sink.record([SpanRecord(...), ...])   # from the event loop: an append, nothing more
    sink.close(timeout=5)                 # what is queued goes out, bounded

A writer thread takes what is queued every `flush_every` seconds (or as soon as `batch` records
wait), encodes it (msgpack, `actors/telemetry/span_records.py`) and writes one length-prefixed
frame to the export process's stdin. When that process is slow (the collector is down, its
exporter retrying), the pipe fills, the writer waits there, and the queue grows to `max_queued`
records or `max_queued_bytes` (their estimated encoded size, `span_bounds.estimated_bytes`:
their strings' lengths plus a fixed overhead each), whichever comes first: beyond that new
records are dropped and counted, so a collector outage (or requests that make long spans)
costs spans, never memory or request latency. A call's records are queued or dropped
together: a request's trace is whole or absent. An export process that dies is started again
(at most once per `restart_after` seconds); records that arrive meanwhile are dropped."""

from __future__ import annotations

import collections
import contextlib
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO

import structlog

from actors.telemetry.span_bounds import estimated_bytes
from actors.telemetry.span_records import SpanRecord, encode_records

log = structlog.get_logger("tokenmill.tracing")

FRAME_HEADER_BYTES = 4  # big-endian length of the msgpack payload that follows


class SpanSink:
    def __init__(
        self,
        argv: list[str],
        *,
        max_queued: int = 50_000,
        max_queued_bytes: int = 32 << 20,  # ~2x `max_queued` usual records (~300 B each)
        batch: int = 1024,
        flush_every: float = 0.2,
        restart_after: float = 10.0,
    ) -> None:
        self.argv = argv
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.batch = batch
        self.flush_every = flush_every
        self.restart_after = restart_after
        self.refused = 0  # records dropped at the door: the queue was full (event loop's count)
        self.lost = 0  # records dropped by the writer: no export process (writer's count)
        self.written = 0  # records written to the export process
        # (record, its estimated bytes); queued bytes = in - out, each counter with one writer
        # (`record`'s caller, the writer thread), as `refused` and `lost` have.
        self._queue: collections.deque[tuple[SpanRecord, int]] = collections.deque()
        self._bytes_in = 0
        self._bytes_out = 0
        self._wake = threading.Event()
        self._closing = False
        self._process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._thread = threading.Thread(target=self._write_loop, name="span-sink", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def record(self, spans: Sequence[SpanRecord]) -> None:
        """Queue finished spans; drops them (counted) when the queue is full (in records or
        in bytes) or closed."""
        sizes = [estimated_bytes(span) for span in spans]
        if (
            self._closing
            or len(self._queue) >= self.max_queued
            or self.queued_bytes + sum(sizes) > self.max_queued_bytes
        ):
            self.refused += len(spans)
            return
        self._bytes_in += sum(sizes)
        self._queue.extend(zip(spans, sizes, strict=True))
        if len(self._queue) >= self.batch:
            self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, let the export process send it, and stop; waits at most
        about `timeout` seconds, then kills the process (its unsent spans are lost)."""
        self._closing = True
        self._wake.set()
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        process = self._process
        if process is None:
            return
        if self._thread.is_alive():  # blocked writing to a process stuck exporting: give up
            process.kill()  # first, or closing its stdin would wait for the writer's lock
        _close_quietly(process.stdin)
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self.dropped:
            log.warning("spans_dropped", dropped=self.dropped, written=self.written)

    @property
    def queued_bytes(self) -> int:
        """The estimated size of what waits for the writer."""
        return self._bytes_in - self._bytes_out

    @property
    def dropped(self) -> int:
        return self.refused + self.lost

    def counts(self) -> tuple[int, int]:
        """Records (handed on, dropped) so far."""
        return self.written, self.dropped

    def _spawn(self) -> None:
        self._started_at = time.monotonic()
        try:
            # A session of its own: Ctrl-C or a SIGTERM to the worker's process group does not
            # reach it; it ends when its stdin does (the worker stopped or died).
            self._process = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, start_new_session=True
            )
        except OSError as exc:
            log.error("span_export_not_started", error=repr(exc))
            self._process = None

    def _write_loop(self) -> None:
        while True:
            self._wake.wait(self.flush_every)
            self._wake.clear()
            closing = self._closing
            while self._queue:
                records = self._take()
                try:
                    self._write(records)
                except Exception as exc:  # e.g. an attribute msgpack cannot encode
                    self.lost += len(records)
                    log.error("span_records_lost", error=repr(exc), records=len(records))
            if closing:
                return

    def _take(self) -> list[SpanRecord]:
        queue, take = self._queue, min(len(self._queue), self.batch)
        taken = [queue.popleft() for _ in range(take)]
        self._bytes_out += sum(size for _, size in taken)
        return [record for record, _ in taken]

    def _write(self, records: list[SpanRecord]) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            if time.monotonic() - self._started_at < self.restart_after or self._closing:
                self.lost += len(records)
                return
            if process is not None:
                log.error("span_export_restarted", exit_code=process.returncode)
                _close_quietly(process.stdin)
            self._spawn()
            process = self._process
            if process is None:
                self.lost += len(records)
                return
        payload = encode_records(records)
        assert process.stdin is not None
        try:
            process.stdin.write(len(payload).to_bytes(FRAME_HEADER_BYTES, "big") + payload)
            process.stdin.flush()
        except (OSError, ValueError):  # the process died (broken pipe) or close() gave up
            self.lost += len(records)
            return
        self.written += len(records)


def _close_quietly(stream: IO[bytes] | None) -> None:
    if stream is None:
        return
    with contextlib.suppress(OSError):
        stream.close()
