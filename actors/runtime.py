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
        self._wakeup = asyncio.Event()  # set by send() and stop(); receive() waits on it

    async def send(self, message: M) -> None:
        """Deliver `message`; waits while the mailbox is full."""
        await self.mailbox.put(message)
        self._wakeup.set()

    def try_send(self, message: M) -> bool:
        """Deliver `message` if the mailbox has room; False (dropped) when it is full. For
        notices a sender must never wait on, such as events."""
        try:
            self.mailbox.put_nowait(message)
        except asyncio.QueueFull:
            return False
        self._wakeup.set()
        return True

    def stop(self) -> None:
        """Ask the actor to finish: it stops taking new work and returns from `run()`."""
        self.stopping.set()
        self._wakeup.set()

    @abc.abstractmethod
    async def run(self) -> None:
        """The actor's life. Raising crashes the actor (and, today, the worker)."""

    async def receive(self) -> M | None:
        """The next message, or None once `stop()` is called and the mailbox is empty.

        Cancellation-safe: a message is only ever taken by the call that returns it.
        """
        while self.mailbox.empty():
            if self.stopping.is_set():
                return None
            self._wakeup.clear()
            await self._wakeup.wait()
        return self.mailbox.get_nowait()

    def drain_mailbox(self) -> list[M]:
        """Everything waiting in the mailbox now, without waiting."""
        out: list[M] = []
        while True:
            try:
                out.append(self.mailbox.get_nowait())
            except asyncio.QueueEmpty:
                return out
