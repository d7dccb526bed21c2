"""Hot swaps on the GPU actor with real tiny engines, no Kafka: flip, drain mode, rollback,
failed loads and smoke tests, and a crash of the actor itself."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from actors.gpu_actor import GpuActor
from actors.mail import Admitted, Batch, Outcome, RecordRef, SwapOrder
from actors.runtime import Actor
from actors.swap.swapper import Swapper, SwapSettings, engine_builder_like
from actors.telemetry.trace_context import TraceContext
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.events import Event, ModelSwapFailed, ModelSwapped, ModelSwapStarted
from messages.request import GenerateRequest


class Inbox(Actor[object]):
    """Stands in for the emitter or the events publisher: keeps what it is sent."""

    def __init__(self) -> None:
        super().__init__("inbox", 10_000)

    async def run(self) -> None:  # never started: tests read the mailbox
        raise NotImplementedError

    async def take(self, n: int, kind: type = object) -> list:
        out: list = []
        async with asyncio.timeout(120):
            while len(out) < n:
                message = await self.mailbox.get()
                if isinstance(message, kind):
                    out.append(message)
        return out


def item(request_id: str, digest: str = "", max_new_tokens: int = 4) -> Admitted:
    return Admitted(
        request=GenerateRequest(
            id=request_id, prompt_token_ids=[5, 6, 7], max_new_tokens=max_new_tokens
        ),
        record=RecordRef("requests", 0, abs(hash(request_id)) % 10_000, 0),
        prompt_token_ids=[5, 6, 7],
        reply_topic="results",
        content_type="application/json",
        trace=TraceContext(),
        consumed_at=time.monotonic(),
        deadline=None,
        model_digest=digest,
    )


def batch(*items: Admitted) -> Batch:
    return Batch(bucket=32, items=list(items), tokens=3 * len(items), reason="size")


class Rig:
    def __init__(self, llama: Path, budget: int | None = None, keep: bool = True) -> None:
        engine = Engine(load_model(llama, name="tiny-llama"), EngineConfig(max_num_seqs=4))
        self.outcomes, self.events = Inbox(), Inbox()
        self.gpu = GpuActor(
            engine,
            self.outcomes,
            "w1",
            events=self.events,
            swapper=Swapper(engine_builder_like(engine), SwapSettings(budget, keep)),
        )
        self.first = engine.model.digest

    async def __aenter__(self) -> Rig:
        self.task = asyncio.create_task(self.gpu.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.gpu.stop()
        await self.task

    async def swap(self, target: Path | None, name: str = "b") -> Event:
        await self.gpu.send(SwapOrder(target=target, requested=name, command="n1"))
        started, finished = await self.events.take(2)
        assert isinstance(started, ModelSwapStarted) and started.command == "n1"
        return finished


async def test_flip_while_serving_then_rollback_is_a_flip(tiny_checkpoints) -> None:
    async with Rig(tiny_checkpoints["llama"]) as rig:
        await rig.gpu.send(batch(*[item(f"a{i}", rig.first, 30) for i in range(4)]))
        swapped = await rig.swap(tiny_checkpoints["gpt2"])
        assert isinstance(swapped, ModelSwapped), swapped
        assert swapped.from_model.digest == rig.first and swapped.to_model.digest != rig.first
        assert swapped.load_ms > 0 and swapped.smoke_ms > 0 and not swapped.drained
        # Tokenized for the old model after the flip: tokenized again, run on the new one.
        await rig.gpu.send(batch(item("late", rig.first), item("new", swapped.to_model.digest)))
        outcomes = await rig.outcomes.take(6, Outcome)
        by_id = {o.result.id: o.result for o in outcomes}
        assert all(r.error is None for r in by_id.values())
        assert {by_id[f"a{i}"].model.digest for i in range(4)} == {rig.first}, "old ones finish"
        assert by_id["late"].model.digest == by_id["new"].model.digest == swapped.to_model.digest
        assert rig.gpu.slots.standby is not None, "kept for rollback"
        back = await rig.swap(None, "rollback")
        assert isinstance(back, ModelSwapped) and back.to_model.digest == rig.first
        assert back.load_ms == 0, "the previous model was still loaded: a flip, no load"


async def test_drain_mode_when_both_do_not_fit(tiny_checkpoints) -> None:
    async with Rig(tiny_checkpoints["llama"], budget=1) as rig:
        await rig.gpu.send(batch(*[item(f"a{i}", rig.first, 20) for i in range(3)]))
        swapped = await rig.swap(tiny_checkpoints["gpt2"])
        assert isinstance(swapped, ModelSwapped) and swapped.drained and swapped.pause_ms > 0
        assert rig.gpu.slots.standby is None, "drain mode never holds two models"
        outcomes = await rig.outcomes.take(3, Outcome)
        assert all(o.result.error is None and o.result.model.digest == rig.first for o in outcomes)
        await rig.gpu.send(batch(item("after", rig.first)))
        (after,) = await rig.outcomes.take(1, Outcome)
        assert after.result.error is None
        assert after.result.model.digest == swapped.to_model.digest


def truncated_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return dst


def nan_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    tensors = load_file(weights)
    name = next(n for n in tensors if "embed" in n or "wte" in n)
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, weights, metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("broken", ["missing", "truncated", "nan", "drain_truncated"])
async def test_a_failed_swap_leaves_the_active_model_serving(
    tiny_checkpoints, tmp_path: Path, broken: str
) -> None:
    src = tiny_checkpoints["gpt2"]
    target = {
        "missing": lambda: tmp_path / "nowhere",
        "truncated": lambda: truncated_copy(src, tmp_path / "t"),
        "drain_truncated": lambda: truncated_copy(src, tmp_path / "t"),
        "nan": lambda: nan_copy(src, tmp_path / "n"),
    }[broken]()
    async with Rig(
        tiny_checkpoints["llama"], budget=1 if broken.startswith("drain") else None
    ) as rig:
        failed = await rig.swap(target)
        assert isinstance(failed, ModelSwapFailed), failed
        expected = {"missing": "not found", "truncated": "truncated", "nan": "non-finite"}
        assert expected[broken.removeprefix("drain_")] in failed.reason
        assert rig.gpu.engine.model.digest == rig.first
        await rig.gpu.send(batch(item("still", rig.first)))
        (out,) = await rig.outcomes.take(1, Outcome)
        assert out.result.error is None and out.result.model.digest == rig.first


async def test_rollback_before_any_swap_is_refused(tiny_checkpoints) -> None:
    async with Rig(tiny_checkpoints["llama"]) as rig:
        failed = await rig.swap(None, "rollback")
        assert isinstance(failed, ModelSwapFailed) and "nothing to roll back" in failed.reason


async def test_a_crashed_actor_requeues_what_it_held_once(tiny_checkpoints) -> None:
    from actors.faults import Faults, InjectedFault

    async with Rig(tiny_checkpoints["llama"]) as rig:
        rig.gpu.faults = Faults(gpu_crash_after_steps=2, gpu_crashes=1)
        await rig.gpu.send(batch(*[item(f"c{i}", rig.first, 8) for i in range(3)]))
        with pytest.raises(InjectedFault):
            await rig.task
        assert rig.gpu.running == 3
        assert rig.gpu.recover() == [], "first crash: queued again, nothing failed"
        rig.task = asyncio.create_task(rig.gpu.run())
        outcomes = await rig.outcomes.take(3, Outcome)
        assert sorted(o.result.id for o in outcomes) == ["c0", "c1", "c2"]
        assert all(o.result.error is None for o in outcomes)


async def test_stopping_during_a_load_ends_promptly_and_reports_the_swap_failed(
    tiny_checkpoints,
) -> None:
    rig = Rig(tiny_checkpoints["llama"])
    build = rig.gpu.swapper.build

    def slow_build(path: Path) -> object:
        time.sleep(1.0)
        return build(path)

    rig.gpu.swapper.build = slow_build
    async with rig:
        await rig.gpu.send(SwapOrder(target=tiny_checkpoints["gpt2"], requested="b", command="n"))
        await rig.events.take(1, ModelSwapStarted)
        rig.gpu.stop()
        async with asyncio.timeout(10):
            await rig.task
        (failed,) = await rig.events.take(1, ModelSwapFailed)
        assert "stopped" in failed.reason
        assert rig.gpu.engine.model.digest == rig.first
        rig.task = asyncio.create_task(asyncio.sleep(0))  # already stopped: nothing to await


async def test_a_drain_swap_whose_old_model_cannot_come_back_stops_the_actor(
    tiny_checkpoints, tmp_path: Path
) -> None:
    """Load fails, loading the old model back fails too: the actor raises (its supervisor
    restarts it, which loads the old model again) instead of serving with no model."""
    rig = Rig(tiny_checkpoints["llama"], budget=1)
    build = rig.gpu.swapper.build
    attempts = []

    def flaky_build(path: Path) -> object:
        attempts.append(path)
        if len(attempts) <= 2:
            raise OSError("disk went away")
        return build(path)

    rig.gpu.swapper.build = flaky_build
    async with rig:
        await rig.gpu.send(SwapOrder(target=tiny_checkpoints["gpt2"], requested="b", command="n"))
        with pytest.raises(Exception, match=r"loading .* back failed"):
            await rig.task
        assert not rig.gpu.model_loaded
        assert rig.gpu.recover() == []
        rig.task = asyncio.create_task(rig.gpu.run())  # loads the old model back, serves
        await rig.gpu.send(batch(item("back", rig.first)))
        (out,) = await rig.outcomes.take(1, Outcome)
        assert out.result.error is None and out.result.model.digest == rig.first


async def test_an_item_that_cannot_be_tokenized_again_is_answered(tiny_checkpoints) -> None:
    async with Rig(tiny_checkpoints["llama"]) as rig:
        stale = item("stale", "sha256:a-model-gone-since")
        stale.request = GenerateRequest(
            id="stale", messages=[{"role": "user", "content": "hi"}], max_new_tokens=2
        )
        await rig.gpu.send(batch(stale, item("fine", rig.first)))
        outcomes = {o.result.id: o.result for o in await rig.outcomes.take(2, Outcome)}
        assert outcomes["stale"].error is not None, "the tiny model has no chat template"
        assert outcomes["fine"].error is None


async def test_usage_counts_the_tokens_of_the_model_that_ran_it(tiny_checkpoints) -> None:
    """Tokenized again for the new model: usage is the new model's count, not the ingest's."""
    async with Rig(tiny_checkpoints["llama"]) as rig:
        swapped = await rig.swap(tiny_checkpoints["gpt2"])
        assert isinstance(swapped, ModelSwapped)
        stale = item("stale", rig.first)
        stale.request = GenerateRequest(id="stale", prompt="The quick brown fox", max_new_tokens=2)
        stale.prompt_token_ids = [5] * 40  # what an old tokenizer made of it
        await rig.gpu.send(batch(stale))
        (out,) = await rig.outcomes.take(1, Outcome)
        expected = len(rig.gpu.front.tokenizer.encode("The quick brown fox"))
        assert out.result.usage.prompt_tokens == expected != 40


def test_a_swapped_in_engine_drafts_as_the_active_one_did(tiny_checkpoints) -> None:
    from gpu.speculative.draft_model import load_draft

    llama, qwen2, gpt2 = (tiny_checkpoints[a] for a in ("llama", "qwen2", "gpt2"))
    target = load_model(llama)
    config = EngineConfig(max_num_seqs=4, speculative_model=str(llama))
    own = Engine(target, config, draft=load_draft(llama, target))
    # It drafted for itself (int4): so does the new model, with its own checkpoint.
    swapped = engine_builder_like(own)(qwen2)
    assert swapped.draft_model is not None and swapped.draft_model.path == qwen2
    assert swapped.draft_model.quantization.startswith("int4")
    # Another model drafted: it drafts for the new one too, the same weights.
    other = Engine(
        target,
        EngineConfig(max_num_seqs=4, speculative_model=str(qwen2)),
        draft=load_draft(qwen2, target),
    )
    assert engine_builder_like(other)(gpt2).draft_model is other.draft_model
    assert (
        engine_builder_like(Engine(target, EngineConfig(max_num_seqs=4)))(gpt2).draft_model is None
    )
