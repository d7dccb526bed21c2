"""GpuActor: admits `Batch`es into the engine and steps it on one dedicated thread.

The engine (`gpu/`) is synchronous; `engine.step()` runs in a single-thread executor so the
event loop stays free for Kafka I/O. The engine is touched by one thing at a time: between
steps by this actor (add, abort), during a step by the engine thread.

Mailbox: `Batch`es from the ingest. Sends: `Outcome`s to the emitter.
`stop()`: fail everything still queued or running with `shutting_down`, then return.
A step that raises fails the requests it held with `engine_error`; the actor goes on.
A request whose id is already running waits for that run and gets its result too.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import structlog

from actors.engine_thread import engine_thread
from actors.mail import Admitted, Batch, Outcome
from actors.results import engine_outcome
from actors.runtime import Actor
from actors.tracing import record_batch_span
from gpu.engine import Completion, EngineRequest, StepOutput
from gpu.errors import RequestRejected
from gpu.sequence import SamplingParams
from messages.error_codes import ErrorCode
from messages.result import ErrorInfo, ModelRef

log = structlog.get_logger("tokenmill.gpu")


class EngineLike(Protocol):
    def add(self, request: EngineRequest) -> None: ...
    def step(self) -> StepOutput: ...
    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None: ...
    def has_work(self) -> bool: ...


class GpuActor(Actor[Batch]):
    def __init__(
        self,
        engine: EngineLike,
        model: ModelRef,
        emitter: Actor[Outcome],
        worker_id: str,
        thread: ThreadPoolExecutor | None = None,
    ) -> None:
        """`thread`: the single-thread executor the engine was built on (see engine_thread);
        by default a new one, owned and shut down by this actor."""
        super().__init__("gpu", mailbox_size=64)
        self.thread = thread
        self.engine = engine
        self.model = model
        self.emitter = emitter
        self.worker_id = worker_id
        self.running: dict[str, Admitted] = {}  # request id → what the engine holds
        self.admitted_at: dict[str, float] = {}
        # Copies of a running id (a redelivery, a client retry): answered with its result.
        self.followers: dict[str, list[Admitted]] = {}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        thread = self.thread or engine_thread()
        try:
            while not self.stopping.is_set():
                batches = self.drain_mailbox()
                if not batches and not self.engine.has_work():
                    batch = await self.receive()
                    batches = [batch] if batch is not None else []
                for batch in batches:
                    await self._admit(batch)
                await self._expire_deadlines()
                if self.engine.has_work():
                    try:
                        out = await loop.run_in_executor(thread, self.engine.step)
                    except Exception as exc:  # any engine failure fails the batch it held
                        log.exception("engine_step_failed", running=len(self.running))
                        await self._abort_all(
                            "error", ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=repr(exc))
                        )
                        continue
                    for completion in out.finished:
                        await self._finished(completion)
            await self._abort_all("shutting_down", _SHUTDOWN)
            await self.fail_queued()
        finally:
            if thread is not self.thread:
                thread.shutdown(wait=False, cancel_futures=True)

    async def fail_queued(self) -> None:
        """Answer every batch waiting in the mailbox with `shutting_down` (after `stop()`)."""
        for batch in self.drain_mailbox():
            for item in batch.items:
                await self._send_error(item, _SHUTDOWN)

    async def _admit(self, batch: Batch) -> None:
        now = time.monotonic()
        batch_span = record_batch_span(batch)
        for item in batch.items:
            item.batch_span = batch_span
            request = item.request
            if request.id in self.running:
                self.followers.setdefault(request.id, []).append(item)
                continue
            params = SamplingParams(
                max_new_tokens=request.max_new_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,
                seed=request.seed,
                stop=tuple(request.stop),
                stop_token_ids=tuple(request.stop_token_ids),
            )
            engine_request = EngineRequest(
                request_id=request.id,
                prompt_token_ids=item.prompt_token_ids,
                params=params,
                priority=request.priority,
                arrival_time=item.consumed_at,
            )
            try:
                self.engine.add(engine_request)
            except RequestRejected as exc:
                await self._send_error(item, ErrorInfo(code=_code(exc.code), message=str(exc)))
                continue
            self.running[request.id] = item
            self.admitted_at[request.id] = now

    async def _expire_deadlines(self) -> None:
        now = time.monotonic()
        expired = [i for i, it in self.running.items() if it.deadline and it.deadline <= now]
        for request_id in expired:
            completion = self.engine.abort(request_id, "deadline")
            if completion is not None:
                await self._finished(completion, _DEADLINE)

    async def _abort_all(self, reason: str, error: ErrorInfo) -> None:
        """Abort every running request (and its followers) with `error`."""
        for request_id in list(self.running):
            try:
                completion = self.engine.abort(request_id, reason)
            except Exception:  # a broken engine must not keep anyone waiting
                log.exception("engine_abort_failed", request_id=request_id)
                completion = None
            if completion is not None:
                await self._finished(completion, error)
            else:
                item = self.running.pop(request_id)
                self.admitted_at.pop(request_id, None)
                for copy in [item, *self.followers.pop(request_id, [])]:
                    await self._send_error(copy, error)

    async def _finished(self, completion: Completion, error: ErrorInfo | None = None) -> None:
        item = self.running.pop(completion.request_id, None)
        admitted_at = self.admitted_at.pop(completion.request_id, time.monotonic())
        if item is None:
            return
        for copy in [item, *self.followers.pop(completion.request_id, [])]:
            await self.emitter.send(
                engine_outcome(
                    copy,
                    text=completion.text,
                    token_ids=completion.token_ids,
                    reason=completion.finish_reason,
                    model=self.model,
                    worker=self.worker_id,
                    queued_ms=(admitted_at - copy.consumed_at) * 1000,
                    ttft_ms=completion.ttft_ms,
                    tpot_ms=completion.tpot_ms,
                    error=error,
                )
            )

    async def _send_error(self, item: Admitted, error: ErrorInfo) -> None:
        await self.emitter.send(
            engine_outcome(
                item,
                text="",
                token_ids=[],
                reason="error",
                model=self.model,
                worker=self.worker_id,
                queued_ms=(time.monotonic() - item.consumed_at) * 1000,
                ttft_ms=None,
                tpot_ms=None,
                error=error,
            )
        )


_SHUTDOWN = ErrorInfo(
    code=ErrorCode.SHUTTING_DOWN, message="the worker shut down before the request finished"
)
_DEADLINE = ErrorInfo(
    code=ErrorCode.DEADLINE_EXCEEDED, message="the request's deadline passed while it ran"
)


def _code(engine_code: str) -> ErrorCode:
    try:
        return ErrorCode(engine_code)
    except ValueError:
        return ErrorCode.INVALID_REQUEST
