"""Zero-downtime model swaps on the GPU actor's double-buffered model slots.

    check the memory plan ─┬─ both fit ──► load + smoke test in standby (background thread,
                           │               the active model keeps serving) ──► flip at a step
                           │               boundary ──► old model finishes its sequences in
                           │               standby; kept for rollback or released when idle
                           └─ they don't ─► drain mode: stop admitting, let running sequences
                                            finish, unload, load + smoke test, resume

A failed load or smoke test leaves the active model serving untouched; in drain mode the old
model is loaded back. Rollback flips back to the previous model when it is still in standby,
else loads it again. Swaps run one at a time, in the order they were asked for. Every swap
publishes `ModelSwapStarted` and then `ModelSwapped` (timings, drain pause) or
`ModelSwapFailed` (the reason).

The procedure reaches the GPU actor only through its `ModelSlots` (`actors.swap.model_slots`):
what must wait for a step boundary is asked there and awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from actors.ingest.model_front import ModelFront, result_size_refusal
from actors.mail import SwapOrder
from actors.swap.model_slots import ModelSlots
from actors.telemetry.metrics import SwapOutcome
from gpu.host_heap import loading_weights
from gpu.loading.checkpoint_header import planned_gguf_weights, read_config
from gpu.memory.footprint import engine_bytes, free_bytes, planned_engine_bytes
from gpu.memory.swap_plan import SwapPlan, plan_swap
from gpu.model_holder import free_device_memory
from gpu.smoke_test import SMOKE_PROMPT, smoke_test
from messages.events import ModelSwapFailed, ModelSwapped, ModelSwapStarted
from messages.result import ModelRef

log = structlog.get_logger("tokenmill.swap")

EngineBuilder = Callable[[Path], Any]  # checkpoint path → a built engine (blocking)


class SwapError(Exception):
    """Why a swap did not happen; the active model is still serving."""


@dataclass(frozen=True)
class SwapSettings:
    budget_bytes: int | None = None  # None: the device's free memory decides
    keep_previous: bool = True  # keep the old model in standby (if it fits) for rollback
    max_result_bytes: int | None = None  # a model whose results could be larger is refused


@dataclass
class _Loaded:
    engine: Any
    load_ms: float
    smoke_ms: float


class Swapper:
    def __init__(
        self,
        build: EngineBuilder,
        settings: SwapSettings | None = None,
        *,
        on_swap: Callable[[SwapOutcome, float | None], None] | None = None,
    ) -> None:
        """`build(path)` loads a checkpoint into a new engine like the active one; `on_swap`
        hears each outcome ("swapped" | "failed") and the drain pause in seconds."""
        self._build = build
        self.settings = settings or SwapSettings()
        self.on_swap = on_swap
        self.previous: Path | None = None  # what a rollback returns to
        self._lock = asyncio.Lock()
        self._loader: ThreadPoolExecutor | None = None

    async def swap(self, slots: ModelSlots, order: SwapOrder) -> None:
        """Carry out `order` on the GPU actor's models; every outcome is published."""
        async with self._lock:
            source = slots.front.ref
            slots.publish(
                ModelSwapStarted(
                    worker=slots.worker_id,
                    at=time.time(),
                    command=order.command,
                    from_model=source,
                    to_model=order.requested,
                ),
            )
            log.info("model_swap_started", to=order.requested, source=source.name)
            try:
                event = await self._swap(slots, order, source)
            except asyncio.CancelledError:  # the worker stops (or the GPU actor crashed)
                self._failed(slots, order, "the worker stopped before the swap finished")
                raise
            except Exception as exc:  # every failure is reported; the active model serves on
                reason = str(exc) if isinstance(exc, SwapError) else f"{type(exc).__name__}: {exc}"
                self._failed(slots, order, reason)
                return
            self._heard("swapped", event.pause_ms / 1e3 if event.drained else None)
            log.info(
                "model_swapped",
                source=source.name,
                to=event.to_model.name,
                digest=event.to_model.digest,
                load_ms=round(event.load_ms, 1),
                smoke_ms=round(event.smoke_ms, 1),
                flip_ms=round(event.flip_ms, 3),
                drained=event.drained,
                pause_ms=round(event.pause_ms, 1),
            )
            slots.publish(event)

    def _failed(self, slots: ModelSlots, order: SwapOrder, reason: str) -> None:
        log.warning("model_swap_failed", to=order.requested, reason=reason)
        self._heard("failed", None)
        slots.publish(
            ModelSwapFailed(
                worker=slots.worker_id,
                at=time.time(),
                command=order.command,
                to_model=order.requested,
                reason=reason,
            ),
        )

    async def _swap(self, slots: ModelSlots, order: SwapOrder, source: ModelRef) -> ModelSwapped:
        target = order.target if order.target is not None else self.previous
        if target is None:
            raise SwapError("nothing to roll back to: no swap has happened yet")
        active_path = Path(slots.active.model.path)

        def done(to: ModelRef, **timings: Any) -> ModelSwapped:
            if to != source:
                self.previous = active_path
            return ModelSwapped(
                worker=slots.worker_id,
                at=time.time(),
                command=order.command,
                from_model=source,
                to_model=to,
                max_model_len=slots.front.max_model_len,  # `to` is in front now
                **{"load_ms": 0.0, "smoke_ms": 0.0, "flip_ms": 0.0, **timings},
            )

        if _same_path(active_path, target):
            return done(source)  # already serving it: nothing to do
        standby = slots.standby
        if standby is not None and _same_path(Path(standby.model.path), target):
            # Rollback to a model still loaded: a flip, no load.
            flip_ms = await slots.flip_to(standby)
            return done(slots.front.ref, flip_ms=flip_ms)
        await slots.release_standby()  # at a step boundary, once its sequences are done
        plan = await self._plan(slots, target)
        log.info("swap_plan", to=str(target), plan=plan.describe())
        if not plan.both_fit:
            return await self._drain_swap(slots, target, done)
        loaded = await self._load(self._loader_thread(), target)
        slots.install_standby(loaded.engine)
        flip_ms = await slots.flip_to(loaded.engine)
        if not self.settings.keep_previous:
            slots.request_release()  # done by the GPU actor once the old one's work is done
        return done(
            slots.front.ref, load_ms=loaded.load_ms, smoke_ms=loaded.smoke_ms, flip_ms=flip_ms
        )

    async def _drain_swap(
        self, slots: ModelSlots, target: Path, done: Callable[..., ModelSwapped]
    ) -> ModelSwapped:
        """Stop admitting, wait for the engines to empty, unload, load, resume."""
        pause_start = time.perf_counter()
        try:
            await slots.quiesce()  # at a step boundary: nothing admitted, nothing running
            old_path = slots.unload_active()  # frees the old weights
            thread = slots.engine_thread or self._loader_thread()  # nothing steps meanwhile
            try:
                loaded = await self._load(thread, target)
                failure = None
            except Exception as exc:  # the failed engine goes with `exc` at the block's end
                failure = str(exc) if isinstance(exc, SwapError) else f"{type(exc).__name__}: {exc}"
            if failure is not None:
                free_device_memory()
                await self._load_back(slots, thread, old_path, failure)
                raise SwapError(failure)
            await slots.install_active(loaded.engine)
        finally:
            slots.resume()
        pause_ms = (time.perf_counter() - pause_start) * 1e3
        return done(
            slots.front.ref,
            load_ms=loaded.load_ms,
            smoke_ms=loaded.smoke_ms,
            drained=True,
            pause_ms=pause_ms,
        )

    async def _load_back(
        self, slots: ModelSlots, thread: ThreadPoolExecutor, path: Path, failure: str
    ) -> None:
        """After a failed drain-mode load: serve the old model again, or stop the GPU actor
        (its supervisor restarts it, which loads the old model once more)."""
        try:
            restored = await self._load(thread, path)
        except Exception as exc:
            fatal = SwapError(f"{failure}; loading {path} back failed too: {exc!r}")
            slots.fail(fatal)
            raise fatal from None
        slots.restore_active(restored.engine)

    async def _plan(self, slots: ModelSlots, target: Path) -> SwapPlan:
        active = slots.active
        config = await asyncio.to_thread(read_config, target)
        max_len = active.config.resolved_max_model_len(config)
        dtype = getattr(active.model, "dtype", None)
        device = getattr(active.model, "device", None)
        packed = getattr(active.model, "packed_bytes", 0) > 0  # the new one will be too
        quantization = active.config.quantization
        new = 0
        if dtype:
            name = str(dtype).removeprefix("torch.")
            gguf = await asyncio.to_thread(planned_gguf_weights, target, quantization, name)
            new = planned_engine_bytes(
                config, active.config, dtype, max_len, packed, quantization, gguf
            )
        return plan_swap(
            active_bytes=engine_bytes(active),
            standby_bytes=0,
            new_bytes=new,
            free_bytes=free_bytes(device) if device is not None else 1 << 62,
            budget_bytes=self.settings.budget_bytes,
        )

    async def _load(self, thread: ThreadPoolExecutor, target: Path) -> _Loaded:
        def load_and_test() -> _Loaded:
            start = time.perf_counter()
            engine = self.build(target)
            load_ms = (time.perf_counter() - start) * 1e3
            limit = self.settings.max_result_bytes
            if limit is not None:
                failure = result_size_refusal(ModelFront.of_engine(engine), limit)
                if failure is not None:
                    raise SwapError(failure)
            return _Loaded(engine, load_ms, smoke_ms(engine))

        return await asyncio.get_running_loop().run_in_executor(thread, load_and_test)

    def build(self, path: Path) -> Any:
        """Load `path` into a new engine (blocking; on the thread that will step it, or the
        loader's), its weights in mappings of their own so that a swap-out returns them."""
        with loading_weights():
            return self._build(path)

    def _loader_thread(self) -> ThreadPoolExecutor:
        if self._loader is None:
            self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenmill-loader")
        return self._loader

    def _heard(self, outcome: SwapOutcome, pause_s: float | None) -> None:
        if self.on_swap is not None:
            self.on_swap(outcome, pause_s)


def _same_path(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def smoke_ms(engine: Any) -> float:
    """Smoke-test a freshly loaded engine (`gpu.smoke_test`: a few greedy tokens, finite
    logits; an embedding model's: one short input's vector, finite); the milliseconds it took.
    Raises what fails."""
    if getattr(engine, "embedding", None) is None:
        return smoke_test(engine).ms
    start = time.perf_counter()
    tokens = engine.model.tokenizer.encode(SMOKE_PROMPT) or [0]
    vectors = engine.encode([tokens])
    if len(vectors) != 1 or not np.isfinite(vectors[0]).all():
        raise SwapError("the embedding model made no finite vector for a tiny input")
    return (time.perf_counter() - start) * 1e3


def engine_builder_like(active: Any) -> EngineBuilder:
    """A builder for engines like `active` (same engine settings, dtype and device); it keeps
    those settings, never `active` itself, so a swapped-out engine can be freed. An embedding
    model's folder (`gpu.encoder.is_embedding_model`) gets an encoder engine, any other a
    generative one, whichever `active` is.

    With a draft model (`--speculative-model`), the new engine drafts as `active` does: a
    target that drafted for itself (its own checkpoint, int4) is followed by one that does the
    same; any other draft is kept and drafts for the new model (refused, failing the swap,
    where their tokenizers differ)."""
    config = active.config
    dtype, device = getattr(active.model, "dtype", None), getattr(active.model, "device", None)
    draft = getattr(active, "draft_model", None)
    own_draft = draft is not None and _same_path(draft.path, active.model.path)
    kept = None if own_draft else draft

    def build(path: Path) -> Any:
        from gpu.encoder import is_embedding_model, load_encoder_engine
        from gpu.engine import Engine
        from gpu.loading.loader import load_model
        from gpu.speculative.draft_model import check_draft, load_draft

        if is_embedding_model(path):
            return load_encoder_engine(path, dtype=dtype, device=device, config=config)
        model = load_model(path, dtype=dtype, device=device, quantization=config.quantization)
        spare = kept
        if own_draft:
            spare = load_draft(path, model, config.quantization, name=f"{model.name} draft")
        elif spare is not None:
            check_draft(spare, model)
        return Engine(model, config, draft=spare)

    return build
