"""Where a stuck worker waits: each pending asyncio task's chain of awaits and each thread's
innermost frames, as short strings for one log event (`drain_stuck`).

    log.error("drain_stuck", tasks=task_stacks(), threads=thread_stacks())

A task's own stack (`Task.get_stack`) stops at its outermost coroutine; the await chain
(`cr_await`) names the coroutine it actually waits in, several calls down.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from types import FrameType
from typing import Any

DEPTH = 16  # awaits or frames named per task or thread


def task_stacks() -> dict[str, str]:
    """Each pending task of the running loop: `outer:line > ... > innermost:line`."""
    out = {}
    for task in asyncio.all_tasks():
        if not task.done():
            out[task.get_name()] = _await_chain(task.get_coro())
    return out


def thread_stacks() -> dict[str, str]:
    """Each thread but the caller's: its innermost frames, innermost last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = {}
    for ident, frame in sys._current_frames().items():
        if ident != threading.get_ident():
            out[names.get(ident, str(ident))] = _frames(frame)
    return out


def _await_chain(coro: Any) -> str:
    parts: list[str] = []
    while coro is not None and len(parts) < DEPTH:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            parts.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(parts)


def _frames(frame: FrameType | None) -> str:
    parts: list[str] = []
    while frame is not None and len(parts) < DEPTH:
        parts.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        frame = frame.f_back
    return " > ".join(reversed(parts))
