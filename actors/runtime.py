"""The actor runtime: a bounded mailbox, one `run()` coroutine, an explicit stop.

No framework: an actor is an object that owns its state, receives typed messages through a
`Mailbox` (an `asyncio.Queue` of bounded size), and runs as one task inside the worker's
`TaskGroup`. Sending to a full mailbox waits, which is how backpressure travels from a slow
actor to the one feeding it. Nothing but messages crosses between actors.

Mailboxes exist before their actors: the worker makes them first and hands each actor its
own and the `Address`es it sends to, so actors that send to each other in a circle (the
ingest and the emitter) are still wired through their constructors.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Generic, Protocol, TypeVar

M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)


class Address(Protocol[M_contra]):
    """Where messages of one type can be sent: another actor's mailbox (or the actor)."""

    async def send(self, message: M_contra) -> None: ...

    def try_send(self, message: M_contra) -> bool: ...

    @property
    def closed(self) -> bool: ...


class Mailbox(asyncio.Queue[M]):
    """A bounded queue of messages for one actor, with a wake-up signal for its loop."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"mailbox_size must be positive, got {size}")
        super().__init__(size)
        self.wakeup = asyncio.Event()  # set by send() and wake(); the actor's loop waits on it
        self._closed = False

    @property
    def closed(self) -> bool:
        """Its actor was asked to stop: notices sent with `try_send` are dropped."""
        return self._closed

    async def send(self, message: M) -> None:
        """Deliver `message`; waits while the mailbox is full."""
        await self.put(message)
        self.wakeup.set()

    def try_send(self, message: M) -> bool:
        """Deliver `message` if the mailbox is open and has room; False (dropped) otherwise.
        For notices a sender must never wait on, such as events."""
        if self._closed:
            return False
        try:
            self.put_nowait(message)
        except asyncio.QueueFull:
            return False
        self.wakeup.set()
        return True

    def wake(self) -> None:
        """Wake the actor's loop without a message (something it waits for changed)."""
        self.wakeup.set()

    def close(self) -> None:
        self._closed = True
        self.wakeup.set()


class Actor(abc.ABC, Generic[M]):
    """Subclasses implement `run()`; it returns once `stopping` is set and its work is done."""

    def __init__(self, name: str, mailbox: Mailbox[M] | int) -> None:
        """`mailbox`: the actor's own (made by the wiring beforehand), or the size of a new one."""
        self.name = name
        self.mailbox: Mailbox[M] = mailbox if isinstance(mailbox, Mailbox) else Mailbox(mailbox)
        self.stopping = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self.mailbox.closed

    async def send(self, message: M) -> None:
        """Deliver `message`; waits while the mailbox is full."""
        await self.mailbox.send(message)

    def try_send(self, message: M) -> bool:
        """Deliver `message` if the mailbox is open and has room; False (dropped) otherwise."""
        return self.mailbox.try_send(message)

    def stop(self) -> None:
        """Ask the actor to finish: it stops taking new work and returns from `run()`."""
        self.stopping.set()
        self.mailbox.close()

    @abc.abstractmethod
    async def run(self) -> None:
        """The actor's life. Raising crashes the actor (its supervisor restarts it)."""

    async def receive(self) -> M | None:
        """The next message, or None once `stop()` is called and the mailbox is empty.

        Cancellation-safe: a message is only ever taken by the call that returns it.
        """
        while self.mailbox.empty():
            if self.stopping.is_set():
                return None
            self.mailbox.wakeup.clear()
            await self.mailbox.wakeup.wait()
        return self.mailbox.get_nowait()

    def drain_mailbox(self) -> list[M]:
        """Everything waiting in the mailbox now, without waiting."""
        out: list[M] = []
        while True:
            try:
                out.append(self.mailbox.get_nowait())
            except asyncio.QueueEmpty:
                return out
