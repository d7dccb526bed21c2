"""What the GPU actor sends the emitter: each request's `Outcome` and a streamed one's chunks.

A result is built from its run's `Completion` (every copy of the request gets it), or from an
error for a request that never ran or whose run was lost. A streamed request's last chunk goes
before its result, on the same topic and key.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import structlog

from actors.in_flight import InFlight
from actors.mail import Admitted, Outcome, StreamChunk
from actors.results import engine_outcome, unrun_outcome
from actors.runtime import Address
from actors.swap.model_slots import ModelSlots
from gpu.engine import Completion
from messages.chunk import GenerateChunk
from messages.error_codes import ErrorCode
from messages.result import ErrorInfo

log = structlog.get_logger("tokenmill.gpu")

SHUTDOWN = ErrorInfo(
    code=ErrorCode.SHUTTING_DOWN, message="the worker shut down before the request finished"
)
DEADLINE = ErrorInfo(
    code=ErrorCode.DEADLINE_EXCEEDED, message="the request's deadline passed while it ran"
)
CRASHED = ErrorInfo(
    code=ErrorCode.ENGINE_ERROR,
    message="the GPU actor crashed twice while running this request",
)


class Answers:
    """Builds and sends results and chunks to `outcomes` (the emitter's mailbox); an error
    result names the active model of `slots`."""

    def __init__(
        self, outcomes: Address[Outcome | StreamChunk], slots: ModelSlots, worker_id: str
    ) -> None:
        self.outcomes = outcomes
        self.slots = slots
        self.worker_id = worker_id
        self.chunks_sent = 0
        self.failed_on_shutdown = 0  # answered `shutting_down`

    async def finished(
        self, entry: InFlight, completion: Completion, error: ErrorInfo | None = None
    ) -> None:
        """`entry`'s run ended with `completion`: its last chunks (one per choice), then a
        result for each copy."""
        choices = completion.choices or (completion,)
        for stream, choice in zip(entry.streams, choices, strict=False):
            # its last chunk goes before its result
            last = stream.finish(choice.text, choice.token_ids, time.monotonic())
            if stream.diverged:
                log.warning("stream_diverged", request_id=completion.request_id)
            if last is not None:
                await self.chunk(entry.item, last)
        for copy in entry.everyone:
            if error is SHUTDOWN:
                self.failed_on_shutdown += 1
            await self.outcomes.send(
                engine_outcome(
                    copy,
                    completion,
                    model=entry.model,
                    worker=self.worker_id,
                    queued_ms=(entry.admitted_at - copy.consumed_at) * 1000,
                    error=error,
                )
            )

    async def error(self, item: Admitted, error: ErrorInfo) -> None:
        """Answer `item` with `error` and no tokens."""
        if error is SHUTDOWN:
            self.failed_on_shutdown += 1
        await self.outcomes.send(self.error_outcome(item, error))

    def error_outcome(self, item: Admitted, error: ErrorInfo) -> Outcome:
        return unrun_outcome(
            item, "error", model=self.slots.front.ref, worker=self.worker_id, error=error
        )

    async def due_chunks(self, running: Iterable[InFlight]) -> None:
        """Send the chunk of each streamed request in `running` whose interval has passed."""
        now = time.monotonic()
        for entry in list(running):
            for stream in entry.streams:
                if stream.due(now) and (chunk := stream.take(now)) is not None:
                    await self.chunk(entry.item, chunk)

    async def chunk(self, item: Admitted, chunk: GenerateChunk) -> None:
        self.chunks_sent += 1
        await self.outcomes.send(
            StreamChunk(chunk, item.reply_topic, item.content_type, trace=item.trace)
        )
