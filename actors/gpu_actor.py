"""GpuActor: admits `Batch`es into the engines of its `ModelHolder` and steps them on one thread.

The engines (`gpu/`) are synchronous; every `engine.step()` runs in a single-thread executor
so the event loop stays free for Kafka I/O. An engine is touched by one thing at a time:
between steps by this actor (add, abort, flip), during a step by the engine thread.

Two engines may be loaded at once (see `gpu.model_holder`): the active one, which new
requests run on, and the standby one, which finishes what it held when a swap flipped away
from it. Each request runs on the model whose tokenizer the ingest used for it; if that model
is gone (a drain-mode swap unloaded it), it is tokenized again for the active model.

Mailbox: `Batch`es from the ingest and `SwapOrder`s from the supervisor. Sends: `Outcome`s to
the emitter, `UseModel` to the ingest after a flip, swap events to the events publisher.
`stop()`: fail everything still queued or running with `shutting_down`, then return.
A step that raises fails the requests it held with `engine_error`; the actor goes on.
A request whose id is already running waits for that run and gets its result too.
If `run()` itself crashes, the supervisor calls `recover()` (each held request is queued
again once, or failed) and runs it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import structlog

from actors.engine_thread import engine_thread
from actors.faults import Faults
from actors.ingest.model_front import ModelFront
from actors.mail import Admitted, Batch, Outcome, SwapOrder, UseModel
from actors.results import engine_outcome
from actors.runtime import Actor
from actors.swap.step_boundary import StepBoundary, new_future, resolve
from actors.telemetry.tracing import record_batch_span
from gpu.engine import Completion, EngineRequest, StepOutput
from gpu.errors import RequestRejected
from gpu.model_holder import ModelHolder
from gpu.sequence import SamplingParams
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.events import Event
from messages.result import ErrorInfo, ModelRef

log = structlog.get_logger("tokenmill.gpu")


class EngineLike(Protocol):
    model: Any  # .name, .digest, .path, .tokenizer, .config
    config: Any  # its EngineConfig

    def add(self, request: EngineRequest) -> None: ...
    def step(self) -> StepOutput: ...
    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None: ...
    def has_work(self) -> bool: ...


StepObserver = Callable[[StepOutput], None]


class GpuActor(Actor[Batch | SwapOrder]):
    def __init__(
        self,
        engine: EngineLike,
        emitter: Actor[Outcome],
        worker_id: str,
        thread: ThreadPoolExecutor | None = None,
        *,
        front: ModelFront | None = None,
        faults: Faults | None = None,
        on_step: StepObserver | None = None,
    ) -> None:
        """`thread`: the single-thread executor the engine was built on (see engine_thread);
        by default a new one, owned and shut down by this actor. `front`: the engine's
        `ModelFront` when the caller has it already."""
        super().__init__("gpu", mailbox_size=64)
        self.thread = thread
        self.holder = ModelHolder(engine)
        self.fronts: dict[str, ModelFront] = {
            engine.model.digest: front or ModelFront.of_engine(engine)
        }
        self.emitter = emitter
        self.worker_id = worker_id
        self.faults = faults or Faults()
        self.on_step = on_step
        # Wired by the worker: who hears about a flip, who publishes swap events, and
        # what performs swaps (see actors.swap.swapper).
        self.ingest: Actor[Any] | None = None
        self.events: Actor[Event] | None = None
        self.swapper: Any = None
        self.running: dict[str, Admitted] = {}  # request id → what an engine holds
        self.engine_of: dict[str, EngineLike] = {}  # request id → the engine running it
        self.admitted_at: dict[str, float] = {}
        # Copies of a running id (a redelivery, a client retry): answered with its result.
        self.followers: dict[str, list[Admitted]] = {}
        self.admitting = True  # False while a drain-mode swap waits for the engines to empty
        self.held: list[Batch] = []  # batches received while not admitting
        self.requeued: set[str] = set()  # ids queued again after a crash (once only)
        self.model_of: dict[str, ModelRef] = {}  # request id → the model it runs on
        self.steps = 0
        self.failed_on_shutdown = 0
        self.boundary = StepBoundary()  # what a swap waits for between two steps
        self.fatal: BaseException | None = None  # set by a swap that left no model loaded
        self._active_thread: ThreadPoolExecutor | None = None

    # -- what others may read ------------------------------------------------------------

    @property
    def engine(self) -> EngineLike:
        """The active engine: new requests run here."""
        return self.holder.active  # type: ignore[return-value]

    @property
    def front(self) -> ModelFront:
        return self.fronts[self.engine.model.digest]

    @property
    def model_loaded(self) -> bool:
        """False only inside a drain-mode swap, between unloading one model and the next."""
        return hasattr(self.engine, "step")

    def has_work(self) -> bool:
        return any(e.has_work() for e in self.holder.engines())

    # -- the actor's life ----------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        thread = self.thread or engine_thread()
        self._active_thread = thread
        swaps: set[asyncio.Task[None]] = set()
        try:
            if not self.model_loaded:  # a crash in the middle of a drain-mode swap
                await self._load_back(thread)
            while not self.stopping.is_set():
                if self.fatal is not None:
                    raise self.fatal
                for message in self.drain_mailbox():
                    if isinstance(message, SwapOrder):
                        task = asyncio.create_task(self._swap(message), name="swap")
                        swaps.add(task)
                        task.add_done_callback(swaps.discard)
                    else:
                        self.held.append(message)
                while self.admitting and self.held:
                    await self._admit(self.held.pop(0))
                await self._expire_deadlines()
                await self._at_step_boundary()
                if not await self._step_busy(loop, thread):
                    self._wakeup.clear()
                    if self.mailbox.empty() and not self.boundary.pending():
                        await self._wakeup.wait()
            await self._abort_all("shutting_down", _SHUTDOWN)
            await self.fail_queued()
        finally:
            self.boundary.cancel_all()
            for task in swaps:  # a swap in progress fails; the active model stays
                task.cancel()
            await asyncio.gather(*swaps, return_exceptions=True)
            if thread is not self.thread:
                thread.shutdown(wait=False, cancel_futures=True)

    async def _step_busy(self, loop: asyncio.AbstractEventLoop, thread: Any) -> bool:
        """Step every engine that has work, once; False if none had any."""
        busy = [e for e in self.holder.engines() if e.has_work()]
        if not busy:
            if not self.admitting:
                resolve(self.boundary.quiet)  # drain mode: nothing runs, nothing is admitted
                self.boundary.quiet = []
            return False
        for engine in busy:
            await self._step(loop, thread, engine)
        return True

    async def _step(self, loop: asyncio.AbstractEventLoop, thread: Any, engine: Any) -> None:
        try:
            out = await loop.run_in_executor(thread, engine.step)
        except Exception as exc:  # any engine failure fails the requests it held
            log.exception("engine_step_failed", model=engine.model.name, running=len(self.running))
            error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=repr(exc))
            await self._abort_all("error", error, only=engine)
            return
        self.steps += 1
        if self.on_step is not None:
            self.on_step(out)
        for completion in out.finished:
            await self._finished(completion)
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
        for request_id, item in list(self.running.items()):
            engine = self.engine_of.get(request_id)
            try:
                if engine is not None:
                    engine.abort(request_id, "error")
            except Exception:
                log.exception("engine_abort_failed", request_id=request_id)
            copies = [item, *self.followers.pop(request_id, [])]
            if request_id in self.requeued:
                failed += [self._error_outcome(c, _CRASHED) for c in copies]
            else:
                self.requeued.add(request_id)
                again += copies
        self.running.clear()
        self.engine_of.clear()
        self.model_of.clear()
        self.admitted_at.clear()
        if again:
            self.held.insert(0, Batch(bucket=0, items=again, tokens=0, reason="requeued"))
        self.admitting = True
        log.warning("gpu_recovered", requeued=len(again), failed=len(failed))
        return failed

    # -- swaps (see actors.swap.swapper for the procedure) -----------------------------------

    async def _swap(self, order: SwapOrder) -> None:
        if self.swapper is None:
            log.warning("swap_unsupported", model=order.requested)
            return
        await self.swapper.swap(self, order)

    async def flip_to(self, engine: Any) -> float:
        """Flip to `engine` (loaded, in standby) at the next step boundary; returns the ms
        the flip took. Raises `CancelledError` if the actor stops first."""
        self._not_stopping()
        future: asyncio.Future[float] = new_future()
        self.boundary.flip = (engine, future)
        self._wakeup.set()
        return await future

    async def release_standby(self) -> None:
        """Drop the standby engine once its sequences are done (at a step boundary)."""
        self._not_stopping()
        await self.request_release()

    def request_release(self) -> asyncio.Future[None]:
        """Ask for the standby engine to be dropped once idle; the future says when."""
        future: asyncio.Future[None] = new_future()
        self.boundary.release.append(future)
        self._wakeup.set()
        return future

    async def quiesce(self) -> None:
        """Stop admitting; return once no engine has work (drain mode). The caller sets
        `admitting` back."""
        self._not_stopping()
        self.admitting = False
        future: asyncio.Future[None] = new_future()
        self.boundary.quiet.append(future)
        self._wakeup.set()
        await future

    def _not_stopping(self) -> None:
        if self.stopping.is_set():
            raise asyncio.CancelledError("the worker is shutting down")

    def add_front(self, engine: EngineLike) -> ModelFront:
        front = ModelFront.of_engine(engine)
        self.fronts[engine.model.digest] = front
        return front

    def forget_front(self, digest: str) -> None:
        if self.holder.by_digest(digest) is None:
            self.fronts.pop(digest, None)

    async def _at_step_boundary(self) -> None:
        if self.boundary.flip is not None:
            engine, future = self.boundary.flip
            self.boundary.flip = None
            start = time.perf_counter()
            if self.holder.standby is not engine:
                future.set_exception(RuntimeError("the engine to flip to is not in standby"))
            else:
                self.holder.flip()
                if self.ingest is not None:
                    await self.ingest.send(UseModel(self.front))
                future.set_result((time.perf_counter() - start) * 1e3)
            del engine
        if self.boundary.release and not _busy(self.holder.standby):
            if self.holder.standby is not None:
                name, digest = self.holder.standby.model.name, self.holder.standby.model.digest
                self.holder.release_standby()  # the holder held the last reference
                self.forget_front(digest)
                log.info("model_released", model=name, digest=digest)
            resolve(self.boundary.release)
            self.boundary.release = []

    async def _load_back(self, thread: ThreadPoolExecutor) -> None:
        """Load the model a failed drain-mode swap left unloaded (or raise: no model)."""
        path = self.engine.model.path
        log.warning("model_loading_back", path=str(path))
        engine = await asyncio.get_running_loop().run_in_executor(thread, self.swapper.build, path)
        self.holder.replace_active(engine)
        self.fatal = None
        self.admitting = True

    # -- admission ----------------------------------------------------------------------

    async def _admit(self, batch: Batch) -> None:
        now = time.monotonic()
        batch_span = record_batch_span(batch) if batch.reason != "requeued" else None
        for item in batch.items:
            if batch_span is not None:
                item.batch_span = batch_span
            request = item.request
            self.faults.on_admit(request.id)  # test-only; ends the process when asked to
            if request.id in self.running:
                self.followers.setdefault(request.id, []).append(item)
                continue
            engine, prompt = self._engine_for(item)
            if engine is None:
                await self._send_error(item, prompt)
                continue
            try:
                self._add(engine, item, prompt)
            except RequestRejected as exc:
                await self._send_error(item, ErrorInfo(code=_code(exc.code), message=str(exc)))
                continue
            except Exception as exc:  # never lose an item: it is answered, the actor goes on
                log.exception("admit_failed", request_id=request.id)
                error = ErrorInfo(code=ErrorCode.ENGINE_ERROR, message=repr(exc))
                await self._send_error(item, error)
                continue
            self.running[request.id] = item
            self.engine_of[request.id] = engine
            self.model_of[request.id] = self.fronts[engine.model.digest].ref
            self.admitted_at[request.id] = now

    def _add(self, engine: EngineLike, item: Admitted, prompt: list[int]) -> None:
        request = item.request
        params = SamplingParams(
            max_new_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=request.seed,
            stop=tuple(request.stop),
            stop_token_ids=tuple(request.stop_token_ids),
        )
        engine.add(
            EngineRequest(
                request_id=request.id,
                prompt_token_ids=prompt,
                params=params,
                priority=request.priority,
                arrival_time=item.consumed_at,
            )
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
        expired = [i for i, it in self.running.items() if it.deadline and it.deadline <= now]
        for request_id in expired:
            completion = self.engine_of[request_id].abort(request_id, "deadline")
            if completion is not None:
                await self._finished(completion, _DEADLINE)

    async def _abort_all(
        self, reason: str, error: ErrorInfo, only: EngineLike | None = None
    ) -> None:
        """Abort every running request (and its followers) with `error`."""
        for request_id in list(self.running):
            engine = self.engine_of.get(request_id)
            if only is not None and engine is not only:
                continue
            try:
                completion = engine.abort(request_id, reason) if engine is not None else None
            except Exception:  # a broken engine must not keep anyone waiting
                log.exception("engine_abort_failed", request_id=request_id)
                completion = None
            if completion is not None:
                await self._finished(completion, error)
            else:
                item = self.running.pop(request_id)
                self.admitted_at.pop(request_id, None)
                self.engine_of.pop(request_id, None)
                self.model_of.pop(request_id, None)
                self.requeued.discard(request_id)
                for copy in [item, *self.followers.pop(request_id, [])]:
                    await self._send_error(copy, error)

    async def _finished(self, completion: Completion, error: ErrorInfo | None = None) -> None:
        item = self.running.pop(completion.request_id, None)
        admitted_at = self.admitted_at.pop(completion.request_id, time.monotonic())
        self.engine_of.pop(completion.request_id, None)
        model = self.model_of.pop(completion.request_id, None) or self.front.ref
        if item is None:
            return
        self.requeued.discard(completion.request_id)
        for copy in [item, *self.followers.pop(completion.request_id, [])]:
            if error is _SHUTDOWN:
                self.failed_on_shutdown += 1
            await self.emitter.send(
                engine_outcome(
                    copy,
                    text=completion.text,
                    token_ids=completion.token_ids,
                    reason=completion.finish_reason,
                    model=model,
                    worker=self.worker_id,
                    queued_ms=(admitted_at - copy.consumed_at) * 1000,
                    ttft_ms=completion.ttft_ms,
                    tpot_ms=completion.tpot_ms,
                    error=error,
                    prompt_tokens=completion.prompt_tokens,
                    preemptions=completion.num_preemptions,
                    kv_blocks=completion.num_kv_blocks,
                )
            )

    async def _send_error(self, item: Admitted, error: ErrorInfo) -> None:
        if error is _SHUTDOWN:
            self.failed_on_shutdown += 1
        await self.emitter.send(self._error_outcome(item, error))

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


def _busy(engine: Any) -> bool:
    return engine is not None and engine.has_work()


def _code(engine_code: str) -> ErrorCode:
    try:
        return ErrorCode(engine_code)
    except ValueError:
        return ErrorCode.INVALID_REQUEST
