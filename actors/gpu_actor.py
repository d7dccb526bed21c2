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
Each step runs through `progress` (`actors.guards.step_progress`), which the watchdog reads to
find a step that never returns.
A request whose id is already running waits for that run and gets its result too when it is
a copy of it (an equal request for the same reply topic: a redelivery, a client's retry);
any other is answered `duplicate_request` on its own reply topic at once, never with
another request's output.
A `Cancel` is applied between steps, in mailbox order (so after the batch that brought its
request): a queued request is answered cancelled with no tokens, a running one is aborted
and answered with what it made; an id held nowhere here is left alone (a debug event).
If `run()` itself crashes, the supervisor calls `recover()` (each held request is queued
again once, or failed) and runs it again.

Its parts are in `actors.generate`: admission, and the answers sent to the emitter.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from actors.cancel.held import take_from_batches
from actors.engine_thread import engine_thread
from actors.faults import Faults
from actors.generate.admission import admit
from actors.generate.answers import CRASHED, DEADLINE, SHUTDOWN, Answers
from actors.guards.step_progress import StepProgress
from actors.in_flight import EngineLike, InFlight
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
from actors.results import cancelled_before_engine
from actors.runtime import Actor, Address, Mailbox
from actors.streaming.policy import StreamPolicy
from actors.streaming.token_stream import TokenStream
from actors.swap.model_slots import ModelSlots
from actors.swap.swapper import Swapper
from gpu.choices import parent_of
from gpu.engine import Completion, StepOutput
from messages.error_codes import ErrorCode
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
        progress: StepProgress | None = None,
    ) -> None:
        """`outcomes`: the emitter's mailbox. `thread`: the single-thread executor the engine
        was built on (see engine_thread); by default a new one, owned and shut down by this
        actor. `front`: the engine's `ModelFront` when the caller has it already. `flips`:
        the ingest's mailbox, told of each new active model; `events`: the events publisher;
        `swapper`: what carries out `SwapOrder`s (None: they are refused); `streaming`: the
        worker's chunk intervals for streamed requests; `progress`: where the engine thread
        reports its steps (default: one with the default bound, unwatched)."""
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
        self.on_cancel = on_cancel
        self.progress = progress or StepProgress()
        self.in_flight: dict[str, InFlight] = {}  # request id → what an engine runs for it
        self.held: list[Batch] = []  # batches received while not admitting
        self.steps = 0
        self.answers = Answers(outcomes, self.slots, worker_id)

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
    def chunks_sent(self) -> int:
        """Streamed requests' chunks sent to the emitter."""
        return self.answers.chunks_sent

    @property
    def failed_on_shutdown(self) -> int:
        """Requests answered `shutting_down`."""
        return self.answers.failed_on_shutdown

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
            await self._abort_all("shutting_down", SHUTDOWN)
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
            step = functools.partial(self.faults.stepping, engine.step, self.steps)
            out = await loop.run_in_executor(thread, self.progress.timed, step)
        except Exception as exc:  # any engine failure fails the requests it held
            log.exception("engine_step_failed", model=engine.model.name, running=self.running)
            error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=repr(exc))
            await self._abort_all("error", error, only=engine)
            return
        self.steps += 1
        if self.on_step is not None:
            self.on_step(out)
        for sequence_id, token in out.new_tokens:
            if (stream := self._stream_of(sequence_id)) is not None:
                stream.add(token)
        for sequence_id, entries in out.new_logprobs.items():
            if (stream := self._stream_of(sequence_id)) is not None:
                stream.add_logprobs(entries)
        for completion in out.finished:
            await self._finished(completion)
        await self.answers.due_chunks(self.in_flight.values())
        self.faults.after_gpu_step(self.steps)  # test-only; raises when a test asked for it

    def _stream_of(self, sequence_id: str) -> TokenStream | None:
        """The chunk state of an engine sequence: a streamed request's, or with `n` > 1 one
        of its choices' (the engine runs choice `i` as sequence `child_id(id, i)`)."""
        entry, index = self.in_flight.get(sequence_id), 0
        if entry is None and (parent := parent_of(sequence_id)) is not None:
            entry, index = self.in_flight.get(parent[0]), parent[1]
        if entry is None or index >= len(entry.streams):
            return None
        return entry.streams[index]

    async def fail_queued(self) -> None:
        """Answer every batch waiting (mailbox or held) with `shutting_down` (after `stop()`)."""
        batches, self.held = self.held, []
        for message in [*batches, *self.drain_mailbox()]:
            if isinstance(message, Batch):
                for item in message.items:
                    await self.answers.error(item, SHUTDOWN)

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
                failed += [self.answers.error_outcome(c, CRASHED) for c in entry.everyone]
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

    async def _admit(self, batch: Batch) -> None:
        await admit(
            batch,
            self.in_flight,
            slots=self.slots,
            answers=self.answers,
            faults=self.faults,
            streaming=self.streaming,
        )

    async def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for entry in list(self.in_flight.values()):
            deadline = entry.item.deadline
            if deadline and deadline <= now:
                completion = entry.engine.abort(entry.item.request.id, "deadline")
                if completion is not None:
                    await self._finished(completion, DEADLINE)

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
                    await self.answers.error(copy, error)

    async def _finished(self, completion: Completion, error: ErrorInfo | None = None) -> None:
        entry = self.in_flight.pop(completion.request_id, None)
        if entry is not None:
            await self.answers.finished(entry, completion, error)
