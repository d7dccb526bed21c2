"""A stuck drain names where each task waits, several awaits down, and where each thread is."""

from __future__ import annotations

import asyncio
import threading

from actors.task_stacks import task_stacks, thread_stacks


async def _innermost(gate: asyncio.Event, entered: asyncio.Event) -> None:
    entered.set()
    await gate.wait()


async def _outer(gate: asyncio.Event, entered: asyncio.Event) -> None:
    await _innermost(gate, entered)


async def test_a_pending_task_is_named_down_to_the_coroutine_it_waits_in() -> None:
    gate, entered = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(_outer(gate, entered), name="stuck")
    await entered.wait()  # it has reached its wait (it suspends there before this resumes)
    try:
        chain = task_stacks()["stuck"]
    finally:
        gate.set()
        await task
    assert chain.index("_outer") < chain.index("_innermost"), chain


def test_a_blocked_thread_is_named_with_its_innermost_frame() -> None:
    release, waiting = threading.Event(), threading.Event()

    def blocked() -> None:
        waiting.set()
        release.wait()

    thread = threading.Thread(target=blocked, name="engine-like")
    thread.start()
    waiting.wait()
    try:
        stacks = thread_stacks()
    finally:
        release.set()
        thread.join()
    assert "blocked" in stacks["engine-like"]
