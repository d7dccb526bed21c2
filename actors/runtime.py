"""The actor runtime: a bounded mailbox, one `run()` coroutine, an explicit stop.

No framework: an actor is an object that owns its state, receives typed messages through an
`asyncio.Queue` of bounded size, and runs as one task inside the worker's `TaskGroup`.
Sending to a full mailbox waits, which is how backpressure travels from a slow actor to the
one feeding it. Nothing but messages crosses between actors.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Generic, TypeVar

M = TypeVar("M")


class Actor(abc.ABC, Generic[M]):
    """Subclasses implement `run()`; it returns once `stopping` is set and its work is done."""

    def __init__(self, name: str, mailbox_size: int) -> None:
        if mailbox_size <= 0:
            raise ValueError(f"mailbox_size must be positive, got {mailbox_size}")
        self.name = name
        self.mailbox: asyncio.Queue[M] = asyncio.Queue(mailbox_size)
        self.stopping = asyncio.Event()

    async def send(self, message: M) -> None:
        """Deliver `message`; waits while the mailbox is full."""
        await self.mailbox.put(message)

    def stop(self) -> None:
        """Ask the actor to finish: it stops taking new work and returns from `run()`."""
        self.stopping.set()

    @abc.abstractmethod
    async def run(self) -> None:
        """The actor's life. Raising crashes the actor (and, today, the worker)."""

    async def receive(self) -> M | None:
        """The next message, or None once `stop()` is called and the mailbox is empty."""
        if self.stopping.is_set() and self.mailbox.empty():
            return None
        getter = asyncio.ensure_future(self.mailbox.get())
        stopper = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not getter.done():
                getter.cancel()
        if getter in done and not getter.cancelled():
            return getter.result()
        return None

    def drain_mailbox(self) -> list[M]:
        """Everything waiting in the mailbox now, without waiting."""
        out: list[M] = []
        while True:
            try:
                out.append(self.mailbox.get_nowait())
            except asyncio.QueueEmpty:
                return out
