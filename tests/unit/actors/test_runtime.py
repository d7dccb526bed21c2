"""The actor runtime: bounded mailbox, FIFO delivery, send waits when full, stop then drain."""

from __future__ import annotations

import asyncio

import pytest

from actors.runtime import Actor, Mailbox

# How long a check watches a coroutine it expects to stay blocked (only those checks wait it
# out), and the bound on one it expects to finish at once.
BLOCKED = 0.05


class Recorder(Actor[int]):
    """Receives until stopped, keeping what it got."""

    def __init__(self, mailbox_size: int = 4, mailbox: Mailbox[int] | None = None) -> None:
        super().__init__("recorder", mailbox or mailbox_size)
        self.got: list[int] = []

    async def run(self) -> None:
        while (message := await self.receive()) is not None:
            self.got.append(message)


def test_mailbox_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="mailbox_size must be positive, got 0"):
        Recorder(0)


async def test_messages_arrive_in_the_order_sent() -> None:
    actor = Recorder(mailbox_size=8)
    for n in range(5):
        await actor.send(n)
    assert [await actor.receive() for _ in range(5)] == [0, 1, 2, 3, 4]
    assert actor.mailbox.empty()


async def test_a_full_mailbox_makes_send_wait() -> None:
    actor = Recorder(mailbox_size=2)
    await actor.send(1)
    await actor.send(2)
    assert actor.mailbox.full()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(actor.send(3), BLOCKED)  # the timed-out send delivers nothing
    assert actor.drain_mailbox() == [1, 2]

    await actor.send(1)
    await actor.send(2)
    sender = asyncio.create_task(actor.send(3))
    await asyncio.sleep(0)
    assert not sender.done()  # waiting for room
    assert await actor.receive() == 1
    await asyncio.wait_for(sender, BLOCKED)  # the receive made room
    assert actor.drain_mailbox() == [2, 3]


async def test_receive_waits_for_a_message() -> None:
    actor = Recorder()
    receiver = asyncio.create_task(actor.receive())
    await asyncio.sleep(0)
    assert not receiver.done()
    await actor.send(42)
    assert await asyncio.wait_for(receiver, BLOCKED) == 42


async def test_stop_wakes_a_waiting_receive_with_none() -> None:
    actor = Recorder()
    receiver = asyncio.create_task(actor.receive())
    await asyncio.sleep(0)
    actor.stop()
    assert await asyncio.wait_for(receiver, BLOCKED) is None
    await actor.send(7)  # the mailbox still works: a receive after stop gets queued mail
    assert await actor.receive() == 7


async def test_after_stop_queued_messages_come_first_then_none() -> None:
    actor = Recorder()
    for n in (1, 2, 3):
        await actor.send(n)
    actor.stop()
    assert actor.stopping.is_set()
    assert [await actor.receive() for _ in range(3)] == [1, 2, 3]
    assert await actor.receive() is None
    assert await actor.receive() is None  # and stays None


async def test_run_finishes_its_mail_then_returns() -> None:
    actor = Recorder()
    task = asyncio.create_task(actor.run())
    for n in range(10):  # more than the mailbox holds: sends wait for run() to take some
        await asyncio.wait_for(actor.send(n), 1)
    actor.stop()
    await asyncio.wait_for(task, 1)
    assert actor.got == list(range(10))


async def test_a_cancelled_receive_loses_no_message() -> None:
    actor = Recorder()
    receiver = asyncio.create_task(actor.receive())
    await asyncio.sleep(0)
    receiver.cancel()
    with pytest.raises(asyncio.CancelledError):
        await receiver
    await actor.send(5)
    assert actor.drain_mailbox() == [5]


async def test_a_receive_cancelled_as_mail_arrives_loses_no_message() -> None:
    actor = Recorder()
    receiver = asyncio.create_task(actor.receive())
    await asyncio.sleep(0)  # receive() is waiting
    await actor.send(5)  # room in the mailbox: returns without yielding
    receiver.cancel()
    try:
        got = [await receiver]
    except asyncio.CancelledError:
        got = []
    assert got + actor.drain_mailbox() == [5]


def test_drain_mailbox_takes_everything_without_waiting() -> None:
    actor = Recorder(mailbox_size=4)
    assert actor.drain_mailbox() == []
    for n in (1, 2, 3):
        actor.mailbox.put_nowait(n)
    assert actor.drain_mailbox() == [1, 2, 3]
    assert actor.mailbox.empty()
    assert actor.drain_mailbox() == []


async def test_drain_mailbox_makes_room_for_waiting_senders() -> None:
    actor = Recorder(mailbox_size=1)
    await actor.send(1)
    sender = asyncio.create_task(actor.send(2))
    await asyncio.sleep(0)
    assert not sender.done()
    assert actor.drain_mailbox() == [1]
    await asyncio.wait_for(sender, BLOCKED)
    assert actor.drain_mailbox() == [2]


async def test_a_mailbox_made_first_is_the_actors_own() -> None:
    mailbox: Mailbox[int] = Mailbox(2)
    await mailbox.send(1)  # a sender wired before the actor exists
    actor = Recorder(mailbox=mailbox)
    assert await actor.receive() == 1


def test_a_stopped_actors_mailbox_drops_notices_but_keeps_mail() -> None:
    actor = Recorder()
    actor.stop()
    assert actor.closed and not actor.try_send(1)
    assert actor.drain_mailbox() == []
