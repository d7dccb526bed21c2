"""The one place a non-streamed answer meets a client that leaves before it: the work is
cancelled, and the request it sent is cancelled on the workers (a stream's events do the same
for themselves: `Gateway.stream`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


async def unless_disconnected(
    request: Request, work: Awaitable[T], on_gone: Callable[[], None]
) -> T | None:
    """`work`'s value, or None when the client disconnects first: `work` is then cancelled
    and `on_gone` called (it sends the cancel). The body has been read, so the next ASGI
    message can only be the disconnect."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    working = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({working, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not working.done():
            working.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching
    if working.done() and not working.cancelled():
        return working.result()
    with contextlib.suppress(asyncio.CancelledError):
        await working  # cancelled just now: let it finish its cleanup
    on_gone()
    return None
