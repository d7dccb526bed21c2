"""ModelSlots: the GPU actor's double-buffered models. A swap's requests (flip, release,
quiesce) wait for the actor's next step boundary; plain calls (install, unload, restore, fail)
act at once; a stop cancels what waits. Fake engines: the slots only read a model's identity
and whether an engine has work."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from actors.ingest.model_front import ModelFront
from actors.mail import UseModel
from actors.runtime import Mailbox
from actors.swap.model_slots import ModelSlots

T = TypeVar("T")


class FakeEngine:
    """Shaped like `gpu.engine.Engine` as far as the slots and `ModelFront.of_engine` look."""

    def __init__(self, name: str) -> None:
        tokenizer = SimpleNamespace(chat_template=None)
        config = SimpleNamespace(vocab_size=100)
        self.model = SimpleNamespace(
            name=name, digest=f"sha-{name}", path=f"/models/{name}", tokenizer=tokenizer,
            config=config,
        )  # fmt: skip
        self.config = SimpleNamespace(max_prompt_tokens=None, max_new_tokens=16)
        self.max_model_len = 64
        self.work = False

    def has_work(self) -> bool:
        return self.work

    def step(self) -> None:
        raise NotImplementedError  # never stepped here: only its presence says "loaded"


class Rig:
    def __init__(self) -> None:
        self.first = FakeEngine("first")
        self.stopping = asyncio.Event()
        self.wakes = 0
        self.woken = asyncio.Event()
        self.flips: Mailbox[UseModel] = Mailbox(16)
        self.slots = ModelSlots(
            self.first,
            ModelFront.of_engine(self.first),
            worker_id="w1",
            stopping=self.stopping,
            wake=self.wake,
            flips=self.flips,
        )

    def wake(self) -> None:
        self.wakes += 1
        self.woken.set()

    def told(self) -> list[str]:
        """The models the ingest was told to use, by name, in order."""
        out = []
        while not self.flips.empty():
            out.append(self.flips.get_nowait().front.name)
        return out


async def asked(rig: Rig, request: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Start a swap's request and let it file itself (it wakes the actor's loop when it has)."""
    rig.woken.clear()
    task = asyncio.create_task(request)
    await rig.woken.wait()
    return task


async def test_a_new_slots_serves_its_one_engine() -> None:
    rig = Rig()
    slots = rig.slots
    assert slots.active is rig.first and slots.standby is None
    assert slots.engines() == [rig.first]
    assert slots.front.name == "first" and slots.front_of(rig.first) is slots.front
    assert slots.model_loaded and slots.admitting and slots.fatal is None
    assert slots.standby_ref is None and not slots.pending()


async def test_a_flip_waits_for_the_step_boundary_then_swaps_active_and_standby() -> None:
    rig = Rig()
    slots, second = rig.slots, FakeEngine("second")
    slots.install_standby(second)
    assert slots.active is rig.first and slots.standby is second
    assert slots.standby_ref is not None and slots.standby_ref.name == "second"

    flip = await asked(rig, slots.flip_to(second))
    assert slots.pending() and not flip.done(), "nothing flips in the middle of a step"
    assert slots.active is rig.first

    await slots.at_step_boundary()
    took_ms = await flip
    assert isinstance(took_ms, float) and took_ms >= 0
    assert slots.active is second and slots.standby is rig.first, "the old one finishes there"
    assert slots.engines() == [second, rig.first]
    assert slots.front.name == "second"
    assert slots.standby_ref is not None and slots.standby_ref.digest == "sha-first"
    assert rig.told() == ["second"], "the ingest tokenizes new requests for the new model"
    assert not slots.pending()


async def test_a_flip_to_an_engine_not_in_standby_fails_and_changes_nothing() -> None:
    rig = Rig()
    flip = await asked(rig, rig.slots.flip_to(FakeEngine("stranger")))
    await rig.slots.at_step_boundary()
    with pytest.raises(RuntimeError, match="not in standby"):
        await flip
    assert rig.slots.active is rig.first and rig.told() == []


async def test_the_standby_is_released_only_once_it_has_finished_its_sequences() -> None:
    rig = Rig()
    slots, second = rig.slots, FakeEngine("second")
    slots.install_standby(second)
    flip = await asked(rig, slots.flip_to(second))
    await slots.at_step_boundary()
    await flip
    rig.first.work = True  # still running what it held at the flip

    release = await asked(rig, slots.release_standby())
    await slots.at_step_boundary()
    assert not release.done() and slots.standby is rig.first and slots.pending()

    rig.first.work = False
    await slots.at_step_boundary()
    await release
    assert slots.standby is None and slots.engines() == [second]
    assert "sha-first" not in slots.fronts, "its front goes with it"
    assert slots.standby_ref is None and not slots.pending()


async def test_releasing_an_empty_standby_is_answered_at_the_next_boundary() -> None:
    rig = Rig()
    release = rig.slots.request_release()
    assert rig.slots.pending() and not release.done()
    await rig.slots.at_step_boundary()
    assert release.done() and rig.slots.active is rig.first


async def test_quiesce_stops_admitting_until_no_engine_has_work_and_resume_admits_again() -> None:
    rig = Rig()
    quiet = await asked(rig, rig.slots.quiesce())
    assert not rig.slots.admitting and rig.slots.pending() and not quiet.done()
    rig.slots.quiet_reached()
    await quiet
    assert not rig.slots.admitting, "still paused: the swap decides when to go on"
    rig.slots.resume()
    assert rig.slots.admitting and not rig.slots.pending()


async def test_quiet_reached_resolves_nothing_while_admitting() -> None:
    rig = Rig()
    rig.slots.quiet_reached()  # an idle loop says so at every turn
    assert rig.slots.admitting and not rig.slots.pending()


async def test_drain_mode_unloads_keeps_the_identity_and_installs_the_next_model() -> None:
    rig = Rig()
    slots = rig.slots
    slots.install_standby(FakeEngine("kept"))
    quiet = await asked(rig, slots.quiesce())
    slots.quiet_reached()
    await quiet
    path = slots.unload_active()
    assert str(path) == "/models/first"
    assert not slots.model_loaded and slots.standby is None, "both models' memory comes back"
    assert (slots.active.model.name, slots.active.model.digest) == ("first", "sha-first")
    assert not slots.active.has_work()
    slots.resume()
    assert not slots.admitting, "nothing is admitted while no model is loaded"

    second = FakeEngine("second")
    await slots.install_active(second)
    assert slots.active is second and slots.model_loaded and slots.front.name == "second"
    assert "sha-first" not in slots.fronts
    assert rig.told() == ["second"]


async def test_a_failed_drain_mode_load_restores_the_model_and_clears_the_failure() -> None:
    rig = Rig()
    slots = rig.slots
    quiet = await asked(rig, slots.quiesce())
    slots.quiet_reached()
    await quiet
    slots.unload_active()
    wakes = rig.wakes
    error = RuntimeError("the new checkpoint would not load")
    slots.fail(error)
    assert slots.fatal is error and rig.wakes == wakes + 1, "the loop wakes to raise it"

    again = FakeEngine("first")
    slots.restore_active(again)
    assert slots.active is again and slots.model_loaded
    assert slots.fatal is None and slots.admitting
    assert slots.front.name == "first", "the same model: its front was kept"


async def test_a_stop_cancels_what_waits_and_refuses_new_requests() -> None:
    rig = Rig()
    slots, second = rig.slots, FakeEngine("second")
    slots.install_standby(second)
    flip = await asked(rig, slots.flip_to(second))
    quiet = await asked(rig, slots.quiesce())
    release = slots.request_release()

    slots.cancel_all()
    for waiting in (flip, quiet):
        with pytest.raises(asyncio.CancelledError):
            await waiting
    assert release.cancelled() and not slots.pending()
    assert slots.active is rig.first, "nothing flipped"

    rig.stopping.set()
    for refused in (slots.flip_to(second), slots.quiesce(), slots.release_standby()):
        with pytest.raises(asyncio.CancelledError):
            await refused
    assert not slots.pending()
