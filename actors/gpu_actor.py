"""GpuActor: admits `Batch`es into the engines of its `ModelSlots` and steps them on one thread.

The engines (`gpu/`) are synchronous; every `engine.step()` runs in a single-thread executor
so the event loop stays free for Kafka I/O. An engine is touched by one thing at a time:
between steps by this actor (add, abort, flip), during a step by the engine thread.

Two engines may be loaded at once (see `actors.swap.model_slots`): the active one, which new
requests run on, and the standby one, which finishes what it held when a swap flipped away
from it; a swap reaches them only through `ModelSlots`. Each request runs on the model whose
tokenizer the ingest used for it; if that model is gone (a drain-mode swap unloaded it), it
is tokenized again for the active model. Each running request has one `InFlight` record.

Mailbox: `Batch`es and `Cancel`s from the ingest, `SwapOrder`s from the supervisor. Sends:
`Outcome`s to the emitter (and, for a request with `stream`, its `StreamChunk`s first, see
`actors.streaming`), `UseModel` to the ingest after a flip, swap events to the events
publisher.
`stop()`: fail everything still queued or running with `shutting_down`, then return.
A step that raises fails the requests it held with `engine_error`; the actor goes on.
A request whose id is already running waits for that run and gets its result too when it is
a copy of it (an equal request for the same reply topic: a redelivery, a client's retry);
any other is answered `duplicate_request` on its own reply topic at once, never with
another request's output.
A `Cancel` is applied between steps, in mailbox order (so after the batch that brought its
request): a queued request is answered cancelled with no tokens, a running one is aborted
and answered with what it made; an id held nowhere here is left alone (a debug event).
If `run()` itself crashes, the supervisor calls `recover()` (each held request is queued
again once, or failed) and runs it again.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from actors.cancel.held import take_from_batches
from actors.engine_thread import engine_thread
from actors.faults import Faults
from actors.in_flight import EngineLike, InFlight, engine_request
from actors.ingest.model_front import ModelFront
from actors.mail import (
    Admitted,
    Batch,
    Cancel,
    CancelledIn,
    Outcome,
    StreamChunk,
    SwapOrder,
    UseModel,
)
from actors.results import cancelled_before_engine, engine_outcome
from actors.runtime import Actor, Address, Mailbox
from actors.streaming.policy import StreamPolicy
from actors.streaming.token_stream import TokenStream
from actors.swap.model_slots import ModelSlots
from actors.swap.swapper import Swapper
from actors.telemetry.tracing import record_batch_span
from gpu.engine import Completion, StepOutput
from gpu.errors import RequestRejected
from messages.chunk import GenerateChunk
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.events import Event
from messages.result import ErrorInfo, ModelRef

log = structlog.get_logger("tokenmill.gpu")


StepObserver = Callable[[StepOutput], None]
CancelObserver = Callable[[CancelledIn | None], None]  # where a cancel found it (None: nowhere)


class GpuActor(Actor[Batch | SwapOrder | Cancel]):
    MAILBOX_SIZE = 64

    def __init__(
        self,
        engine: EngineLike,
        outcomes: Address[Outcome | StreamChunk],
        worker_id: str,
        thread: ThreadPoolExecutor | None = None,
        *,
        mailbox: Mailbox[Batch | SwapOrder | Cancel] | None = None,
        front: ModelFront | None = None,
        flips: Address[UseModel] | None = None,
        events: Address[Event] | None = None,
        swapper: Swapper | None = None,
        faults: Faults | None = None,
        on_step: StepObserver | None = None,
        streaming: StreamPolicy | None = None,
        on_cancel: CancelObserver | None = None,
    ) -> None:
        """`outcomes`: the emitter's mailbox. `thread`: the single-thread executor the engine
        was built on (see engine_thread); by default a new one, owned and shut down by this
        actor. `front`: the engine's `ModelFront` when the caller has it already. `flips`:
        the ingest's mailbox, told of each new active model; `events`: the events publisher;
        `swapper`: what carries out `SwapOrder`s (None: they are refused); `streaming`: the
        worker's chunk intervals for streamed requests."""
        super().__init__("gpu", mailbox or Mailbox(self.MAILBOX_SIZE))
        self.thread = thread
        self.outcomes = outcomes
        self.worker_id = worker_id
        self.slots = ModelSlots(
            engine,
            front or ModelFront.of_engine(engine),
            worker_id=worker_id,
            stopping=self.stopping,
            wake=self.mailbox.wake,
            flips=flips,
            events=events,
        )
        self.swapper = swapper
        self.faults = faults or Faults()
        self.on_step = on_step
        self.streaming = streaming or StreamPolicy()
        self.chunks_sent = 0
        self.on_cancel = on_cancel
        self.in_flight: dict[str, InFlight] = {}  # request id → what an engine runs for it
        self.held: list[Batch] = []  # batches received while not admitting
        self.steps = 0
        self.failed_on_shutdown = 0

    # -- what others may read ------------------------------------------------------------

    @property
    def engine(self) -> EngineLike:
        """The active engine: new requests run here."""
        return self.slots.active  # type: ignore[no-any-return]

    @property
    def front(self) -> ModelFront:
        return self.slots.front

    @property
    def model_name(self) -> str:
        return self.slots.front.name

    @property
    def model_loaded(self) -> bool:
        """False only inside a drain-mode swap, between unloading one model and the next."""
        return self.slots.model_loaded

    @property
    def running(self) -> int:
        """Requests the engines run now (copies of a running id not counted)."""
        return len(self.in_flight)

    @property
    def standby(self) -> ModelRef | None:
        """The model kept in standby (for a rollback, or finishing its sequences), if any."""
        return self.slots.standby_ref

    @property
    def kv_blocks(self) -> tuple[int, int]:
        """The active engine's KV-cache blocks: (in use, in the pool)."""
        engine = self.slots.active
        return int(getattr(engine, "blocks_used", 0)), int(getattr(engine, "num_blocks", 0))

    # -- the actor's life ----------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        thread = self.thread or engine_thread()
        self.slots.engine_thread = thread
        swaps: set[asyncio.Task[None]] = set()
        try:
            if not self.model_loaded:  # a crash in the middle of a drain-mode swap
                await self._load_back(thread)
            while not self.stopping.is_set():
                if self.slots.fatal is not None:
                    raise self.slots.fatal
                for message in self.drain_mailbox():
                    if isinstance(message, SwapOrder):
                        task = asyncio.create_task(self._swap(message), name="swap")
                        swaps.add(task)
                        task.add_done_callback(swaps.discard)
                    elif isinstance(message, Cancel):
                        await self._cancel(message)
                    else:
                        self.held.append(message)
                while self.slots.admitting and self.held:
                    await self._admit(self.held.pop(0))
                await self._expire_deadlines()
                await self.slots.at_step_boundary()
                if not await self._step_busy(loop, thread):
                    self.mailbox.wakeup.clear()
                    if self.mailbox.empty() and not self.slots.pending():
                        await self.mailbox.wakeup.wait()
            await self._abort_all("shutting_down", _SHUTDOWN)
            await self.fail_queued()
        finally:
            self.slots.cancel_all()
            for task in swaps:  # a swap in progress fails; the active model stays
                task.cancel()
            await asyncio.gather(*swaps, return_exceptions=True)
            if thread is not self.thread:
                thread.shutdown(wait=False, cancel_futures=True)

    async def _step_busy(self, loop: asyncio.AbstractEventLoop, thread: Any) -> bool:
        """Step every engine that has work, once; False if none had any."""
        busy = [e for e in self.slots.engines() if e.has_work()]
        if not busy:
            self.slots.quiet_reached()  # drain mode: nothing runs, nothing is admitted
            return False
        for engine in busy:
            await self._step(loop, thread, engine)
        return True

    async def _step(self, loop: asyncio.AbstractEventLoop, thread: Any, engine: Any) -> None:
        try:
            out = await loop.run_in_executor(thread, engine.step)
        except Exception as exc:  # any engine failure fails the requests it held
            log.exception("engine_step_failed", model=engine.model.name, running=self.running)
            error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=repr(exc))
            await self._abort_all("error", error, only=engine)
            return
        self.steps += 1
        if self.on_step is not None:
            self.on_step(out)
        for request_id, token in out.new_tokens:
            entry = self.in_flight.get(request_id)
            if entry is not None and entry.stream is not None:
                entry.stream.add(token)
        for completion in out.finished:
            await self._finished(completion)
        await self._send_due_chunks()
        self.faults.after_gpu_step(self.steps)  # test-only; raises when a test asked for it

    async def fail_queued(self) -> None:
        """Answer every batch waiting (mailbox or held) with `shutting_down` (after `stop()`)."""
        batches, self.held = self.held, []
        for message in [*batches, *self.drain_mailbox()]:
            if isinstance(message, Batch):
                for item in message.items:
                    await self._send_error(item, _SHUTDOWN)

    def recover(self) -> list[Outcome]:
        """After `run()` crashed: take back what the engines held.

        Each running request (and its copies) is queued again once; one that was already
        queued again after an earlier crash is answered with `engine_error` instead (returned,
        for the caller to send). Call before running the actor again.
        """
        again: list[Admitted] = []
        failed: list[Outcome] = []
        for entry in self.in_flight.values():
            try:
                entry.engine.abort(entry.item.request.id, "error")
            except Exception:
                log.exception("engine_abort_failed", request_id=entry.item.request.id)
            if entry.requeued:
                failed += [self._error_outcome(c, _CRASHED) for c in entry.everyone]
            else:
                again += entry.everyone
        self.in_flight.clear()
        if again:
            self.held.insert(0, Batch(bucket=0, items=again, tokens=0, reason="requeued"))
        self.slots.admitting = True
        log.warning("gpu_recovered", requeued=len(again), failed=len(failed))
        return failed

    async def _swap(self, order: SwapOrder) -> None:
        if self.swapper is None:
            log.warning("swap_unsupported", model=order.requested)
            return
        await self.swapper.swap(self.slots, order)

    async def _load_back(self, thread: ThreadPoolExecutor) -> None:
        """Load the model a failed drain-mode swap left unloaded (or raise: no model)."""
        if self.swapper is None:
            raise RuntimeError("no model is loaded and there is no swapper to load one")
        path = self.engine.model.path
        log.warning("model_loading_back", path=str(path))
        engine = await asyncio.get_running_loop().run_in_executor(thread, self.swapper.build, path)
        self.slots.restore_active(engine)

    # -- admission ----------------------------------------------------------------------

    async def _admit(self, batch: Batch) -> None:
        now = time.monotonic()
        batch_span = record_batch_span(batch) if batch.reason != "requeued" else None
        for item in batch.items:
            if batch_span is not None:
                item.batch_span = batch_span
            request = item.request
            self.faults.on_admit(request.id)  # test-only; ends the process when asked to
            running = self.in_flight.get(request.id)
            if running is not None and running.is_copy(item):
                running.copies.append(item)
                continue
            if running is not None:
                await self._send_error(item, self._duplicate(item, running))
                continue
            engine, prompt = self._engine_for(item)
            if engine is None:
                await self._send_error(item, prompt)
                continue
            try:
                runs = engine_request(item, prompt)
                if runs.params.json is not None:
                    # Compiling a grammar can take a while (the first builds the library's view
                    # of the vocabulary: seconds for a large one), so not on the event loop.
                    await asyncio.to_thread(engine.prepare, runs)
                engine.add(runs)
            except RequestRejected as exc:
                await self._send_error(item, ErrorInfo(code=exc.code, message=str(exc)))
                continue
            except Exception as exc:  # never lose an item: it is answered, the actor goes on
                log.exception("admit_failed", request_id=request.id)
                error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=repr(exc))
                await self._send_error(item, error)
                continue
            self.in_flight[request.id] = InFlight(
                item,
                engine,
                model=self.slots.front_of(engine).ref,
                admitted_at=now,
                requeued=batch.reason == "requeued",
                stream=self._stream_for(item, engine, now) if request.stream else None,
            )

    @staticmethod
    def _duplicate(item: Admitted, running: InFlight) -> ErrorInfo:
        """The error for `item`, which reuses the id of another request that runs now."""
        log.warning(
            "duplicate_request",
            request_id=item.request.id[:128],
            topic=item.record.topic,
            partition=item.record.partition,
            offset=item.record.offset,
            running_offset=running.item.record.offset,
        )
        message = (
            f"request {item.request.id[:128]!r} is already running on this worker as another "
            "request; use a new id (or send the same request, to the same reply topic, again)"
        )
        return ErrorInfo(code=ErrorCode.DUPLICATE_REQUEST, message=message)

    def _stream_for(self, item: Admitted, engine: Any, now: float) -> TokenStream:
        """The chunk state of a streamed request's run (a run again gets a new one)."""
        tokens, interval_s, floor_s = self.streaming.intervals(item.request)
        return TokenStream(
            item.request.id,
            uuid.uuid4().hex[:16],
            engine.model.tokenizer.decode,
            stop=item.request.stop,
            interval_tokens=tokens,
            interval_s=interval_s,
            min_interval_s=floor_s,
            started=now,
        )

    async def _send_due_chunks(self) -> None:
        now = time.monotonic()
        for entry in list(self.in_flight.values()):
            if entry.stream is not None and entry.stream.due(now):
                chunk = entry.stream.take(now)
                if chunk is not None:
                    await self._send_chunk(entry.item, chunk)

    async def _send_chunk(self, item: Admitted, chunk: GenerateChunk) -> None:
        self.chunks_sent += 1
        await self.outcomes.send(
            StreamChunk(chunk, item.reply_topic, item.content_type, trace=item.trace)
        )

    def _engine_for(self, item: Admitted) -> tuple[Any, Any]:
        """The active engine and `item`'s prompt tokens for it, or (None, the error to answer).

        An item tokenized for another model (queued before a flip) is tokenized again.
        """
        if item.model_digest in ("", self.engine.model.digest):
            return self.engine, item.prompt_token_ids
        try:
            return self.engine, self.front.prompt_tokens(item.request)
        except InvalidRequest as exc:
            return None, ErrorInfo(code=exc.code, message=str(exc))
        except Exception as exc:  # the new model's tokenizer or template failed on it
            return None, ErrorInfo(code=ErrorCode.INVALID_PROMPT, message=repr(exc))

    async def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for entry in list(self.in_flight.values()):
            deadline = entry.item.deadline
            if deadline and deadline <= now:
                completion = entry.engine.abort(entry.item.request.id, "deadline")
                if completion is not None:
                    await self._finished(completion, _DEADLINE)

    async def _cancel(self, cancel: Cancel) -> None:
        """Answer request `cancel.request_id` (and its copies) as cancelled wherever it is held
        here: queued (no tokens) or in an engine (aborted on the engine thread, between steps:
        the tokens made so far)."""
        request_id = cancel.request_id
        self.held, queued = take_from_batches(self.held, request_id)
        for item in queued:
            outcome = cancelled_before_engine(
                item, model=self.front.ref, worker=self.worker_id, where="queue"
            )
            await self.outcomes.send(outcome)
        entry = self.in_flight.get(request_id)
        if entry is not None:
            abort = functools.partial(entry.engine.abort, request_id, "cancelled")
            thread = self.slots.engine_thread
            completion = await asyncio.get_running_loop().run_in_executor(thread, abort)
            if completion is not None:
                await self._finished(completion)
        where: CancelledIn | None = "engine" if entry is not None else "queue" if queued else None
        if where is None and cancel.answered:
            return  # the ingest found it in a bucket (and said so); no copy was here
        if where is None:
            log.debug("cancel_not_held", request_id=request_id, reason=cancel.reason)
        else:
            log.info("request_cancelled", request_id=request_id, where=where, reason=cancel.reason)
        if self.on_cancel is not None:
            self.on_cancel(where)

    async def _abort_all(
        self, reason: str, error: ErrorInfo, only: EngineLike | None = None
    ) -> None:
        """Abort every running request (and its copies) with `error`."""
        for request_id, entry in list(self.in_flight.items()):
            if only is not None and entry.engine is not only:
                continue
            try:
                completion = entry.engine.abort(request_id, reason)
            except Exception:  # a broken engine must not keep anyone waiting
                log.exception("engine_abort_failed", request_id=request_id)
                completion = None
            if completion is not None:
                await self._finished(completion, error)
            else:
                del self.in_flight[request_id]
                for copy in entry.everyone:
                    await self._send_error(copy, error)

    async def _finished(self, completion: Completion, error: ErrorInfo | None = None) -> None:
        entry = self.in_flight.pop(completion.request_id, None)
        if entry is None:
            return
        if entry.stream is not None:  # its last chunk goes before its result
            last = entry.stream.finish(completion.text, completion.token_ids, time.monotonic())
            if entry.stream.diverged:
                log.warning("stream_diverged", request_id=completion.request_id)
            if last is not None:
                await self._send_chunk(entry.item, last)
        for copy in entry.everyone:
            if error is _SHUTDOWN:
                self.failed_on_shutdown += 1
            await self.outcomes.send(
                engine_outcome(
                    copy,
                    text=completion.text,
                    token_ids=completion.token_ids,
                    reason=completion.finish_reason,
                    model=entry.model,
                    worker=self.worker_id,
                    queued_ms=(entry.admitted_at - copy.consumed_at) * 1000,
                    ttft_ms=completion.ttft_ms,
                    tpot_ms=completion.tpot_ms,
                    error=error,
                    prompt_tokens=completion.prompt_tokens,
                    preemptions=completion.num_preemptions,
                    kv_blocks=completion.num_kv_blocks,
                    cached_tokens=completion.cached_tokens,
                )
            )

    async def _send_error(self, item: Admitted, error: ErrorInfo) -> None:
        if error is _SHUTDOWN:
            self.failed_on_shutdown += 1
        await self.outcomes.send(self._error_outcome(item, error))

    def _error_outcome(self, item: Admitted, error: ErrorInfo) -> Outcome:
        return engine_outcome(
            item,
            text="",
            token_ids=[],
            reason="error",
            model=self.front.ref,
            worker=self.worker_id,
            queued_ms=(time.monotonic() - item.consumed_at) * 1000,
            ttft_ms=None,
            tpot_ms=None,
            error=error,
        )


_SHUTDOWN = ErrorInfo(
    code=ErrorCode.SHUTTING_DOWN, message="the worker shut down before the request finished"
)
_DEADLINE = ErrorInfo(
    code=ErrorCode.DEADLINE_EXCEEDED, message="the request's deadline passed while it ran"
)
_CRASHED = ErrorInfo(
    code=ErrorCode.ENGINE_ERROR,
    message="the GPU actor crashed twice while running this request",
)
