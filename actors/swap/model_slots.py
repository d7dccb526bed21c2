"""ModelSlots: the GPU actor's models, and everything a swap may ask of them.

The GPU actor holds its engines in a double-buffered `ModelHolder` (active, standby) with the
`ModelFront` of each. A swap (`actors.swap.swapper`) runs in its own task beside the actor's
loop and reaches the models only through this object: it never touches an engine while a step
may run. What must wait for a step boundary is filed here as a request with a future, which
the GPU actor's loop resolves between two steps (`at_step_boundary`, `quiet_reached`):

- `flip_to`: make the standby engine active (returns the ms the flip took);
- `release_standby`: drop the standby engine once it has finished its sequences;
- `quiesce`: stop admitting and wait until no engine has work (drain mode).

What may happen at once (nothing is stepping then, or the slot is not stepped) is a plain
call: `install_standby`, `unload_active`, `install_active`, `restore_active`, `fail`.
When the actor stops or crashes, every pending request is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import structlog

from actors.ingest.model_front import ModelFront
from actors.mail import UseModel
from actors.runtime import Address
from actors.telemetry.lifecycle_spans import publish_event
from gpu.model_holder import ModelHolder
from messages.events import Event
from messages.result import ModelRef

log = structlog.get_logger("tokenmill.gpu")

Engine = Any  # an `actors.in_flight.EngineLike`, or the placeholder of an unloaded model


class ModelSlots:
    def __init__(
        self,
        engine: Engine,
        front: ModelFront,
        *,
        worker_id: str,
        stopping: asyncio.Event,
        wake: Callable[[], None],
        flips: Address[UseModel] | None = None,
        events: Address[Event] | None = None,
    ) -> None:
        """`stopping`/`wake`: the GPU actor's stop flag and how to wake its loop; `flips`: the
        ingest's mailbox, told of each new active model; `events`: the events publisher."""
        self.holder = ModelHolder(engine)
        self.fronts: dict[str, ModelFront] = {engine.model.digest: front}
        self.worker_id = worker_id
        self.admitting = True  # False while a drain-mode swap waits for the engines to empty
        self.fatal: BaseException | None = None  # set by a swap that left no model loaded
        self.engine_thread: ThreadPoolExecutor | None = None  # the GPU actor's, while it runs
        self._stopping, self._wake = stopping, wake
        self._flips, self._events = flips, events
        self._flip: tuple[Engine, asyncio.Future[float]] | None = None
        self._release: list[asyncio.Future[None]] = []
        self._quiet: list[asyncio.Future[None]] = []

    # -- what everyone may read ----------------------------------------------------------

    @property
    def active(self) -> Engine:
        """The active engine: new requests run here."""
        return self.holder.active

    @property
    def standby(self) -> Engine | None:
        return self.holder.standby

    @property
    def front(self) -> ModelFront:
        return self.fronts[self.active.model.digest]

    @property
    def standby_ref(self) -> ModelRef | None:
        standby = self.holder.standby
        front = self.fronts.get(standby.model.digest) if standby is not None else None
        return front.ref if front is not None else None

    @property
    def model_loaded(self) -> bool:
        """False only inside a drain-mode swap, between unloading one model and the next."""
        return hasattr(self.active, "step")

    def engines(self) -> list[Engine]:
        return self.holder.engines()

    def front_of(self, engine: Engine) -> ModelFront:
        return self.fronts[engine.model.digest]

    # -- what a swap asks, resolved at the GPU actor's next step boundary ------------------

    async def flip_to(self, engine: Engine) -> float:
        """Flip to `engine` (in standby) at the next step boundary; returns the ms the flip
        took. Raises `CancelledError` if the actor stops first."""
        self._not_stopping()
        future: asyncio.Future[float] = _new_future()
        self._flip = (engine, future)
        self._wake()
        return await future

    async def release_standby(self) -> None:
        """Drop the standby engine once its sequences are done (at a step boundary)."""
        self._not_stopping()
        await self.request_release()

    def request_release(self) -> asyncio.Future[None]:
        """Ask for the standby engine to be dropped once idle; the future says when."""
        future: asyncio.Future[None] = _new_future()
        self._release.append(future)
        self._wake()
        return future

    async def quiesce(self) -> None:
        """Stop admitting; return once no engine has work (drain mode). `resume()` ends it."""
        self._not_stopping()
        self.admitting = False
        future: asyncio.Future[None] = _new_future()
        self._quiet.append(future)
        self._wake()
        await future

    # -- what a swap does at once ----------------------------------------------------------

    def publish(self, event: Event) -> None:
        publish_event(self._events, event)

    def install_standby(self, engine: Engine) -> None:
        """Put a loaded engine in the (empty) standby slot, ready for `flip_to`."""
        self.fronts[engine.model.digest] = ModelFront.of_engine(engine)
        self.holder.install_standby(engine)

    def unload_active(self) -> Path:
        """Drain mode, once quiet: drop the active engine and its standby (their memory comes
        back); the active slot keeps the model's identity. Returns the model's path."""
        self.holder.release_standby()
        model = self.active.model
        self.holder.replace_active(_Unloaded(model))
        return Path(model.path)

    async def install_active(self, engine: Engine) -> None:
        """Drain mode: `engine` becomes the active model; the ingest is told."""
        old_digest = self.active.model.digest
        front = ModelFront.of_engine(engine)
        self.fronts[engine.model.digest] = front
        self.holder.replace_active(engine)
        self._forget_front(old_digest)
        if self._flips is not None:
            await self._flips.send(UseModel(front))

    def restore_active(self, engine: Engine) -> None:
        """The unloaded model is back (a drain-mode load failed, or a crash came between):
        serve it again."""
        self.holder.replace_active(engine)
        self.fatal = None
        self.admitting = True

    def resume(self) -> None:
        """End a drain-mode pause: admit again if a model is loaded (else `fail` said why)."""
        if self.model_loaded:
            self.admitting = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """No model is loaded and none could be: the GPU actor raises `error` (its supervisor
        restarts it, which loads the model back)."""
        self.fatal = error
        self._wake()

    # -- the GPU actor's side ------------------------------------------------------------

    def pending(self) -> bool:
        """Something the GPU actor's loop must not sleep through."""
        return self._flip is not None or bool(self._release) or bool(self._quiet)

    async def at_step_boundary(self) -> None:
        """Between two steps: flip if asked, release an idle standby if asked."""
        if self._flip is not None:
            engine, future = self._flip
            self._flip = None
            start = time.perf_counter()
            if self.holder.standby is not engine:
                future.set_exception(RuntimeError("the engine to flip to is not in standby"))
            else:
                self.holder.flip()
                if self._flips is not None:
                    await self._flips.send(UseModel(self.front))
                future.set_result((time.perf_counter() - start) * 1e3)
            del engine
        standby = self.holder.standby
        if self._release and not (standby is not None and standby.has_work()):
            if standby is not None:
                name, digest = standby.model.name, standby.model.digest
                del standby
                self.holder.release_standby()  # the holder held the last reference
                self._forget_front(digest)
                log.info("model_released", model=name, digest=digest)
            _resolve(self._release)
            self._release = []

    def quiet_reached(self) -> None:
        """No engine has work: a drain-mode swap waiting for that may go on."""
        if not self.admitting:
            _resolve(self._quiet)
            self._quiet = []

    def cancel_all(self) -> None:
        futures: list[asyncio.Future[Any]] = [*self._release, *self._quiet]
        if self._flip is not None:
            futures.append(self._flip[1])
        for future in futures:
            if not future.done():
                future.cancel()
        self._flip, self._release, self._quiet = None, [], []

    def _forget_front(self, digest: str) -> None:
        if self.holder.by_digest(digest) is None:
            self.fronts.pop(digest, None)

    def _not_stopping(self) -> None:
        if self._stopping.is_set():
            raise asyncio.CancelledError("the worker is shutting down")


class _Unloaded:
    """Holds the active slot's identity (not its weights) while a drain-mode swap has no
    model loaded."""

    def __init__(self, model: Any) -> None:
        self.model = SimpleNamespace(
            name=model.name, digest=model.digest, path=model.path, tokenizer=model.tokenizer
        )

    def has_work(self) -> bool:
        return False


def _new_future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
