"""ControlActor against a real broker: signed commands in, refusals and events out."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from actors.control import ControlActor
from actors.mail import VerifiedCommand
from messages import headers as h
from messages.control import Rollback, Status, SwapModel
from messages.events import CommandRefused, StatusReply, WorkerDraining
from messages.result import ModelRef
from messages.signing import sign_command
from tests.integration.control_lane import (
    Inbox,
    new_control_lane,
    read_events,
    running_control,
)
from tests.integration.pipeline import produce

encode = msgspec.json.Encoder().encode


async def test_a_signed_command_reaches_the_supervisor(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    inbox = Inbox()
    async with running_control(lane.worker_config(), inbox) as control:
        signed = sign_command(SwapModel(model="next"), lane.secret, now=time.time())
        await produce(lane.bootstrap, lane.control, [encode(signed)])
        assert await inbox.next() == VerifiedCommand(SwapModel(model="next"), signed.nonce)
    assert (control.accepted, control.refused) == (1, 0)


async def test_bad_commands_are_refused_on_the_events_topic(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()
    inbox = Inbox()
    now = time.time()
    good = sign_command(Status(), lane.secret, now=now, nonce="good")
    bad = [
        msgspec.structs.replace(sign_command(Status(), lane.secret, now=now, nonce="unsigned"),
                                signature=""),
        sign_command(Status(), "not-the-secret", now=now, nonce="wrong-secret"),
        sign_command(Status(), lane.secret, now=now - 3600, nonce="stale"),
    ]  # fmt: skip
    async with running_control(config, inbox) as control:
        await produce(
            lane.bootstrap,
            lane.control,
            [encode(good), *map(encode, bad), encode(good), b"not json", None],
            keys=[None] * 6 + [b"tombstone"],
        )
        assert (await inbox.next()).nonce == "good"
        refusals = await read_events(lane.bootstrap, lane.events, until=6)
        # Still serving after all that.
        later = sign_command(Rollback(), lane.secret, now=time.time())
        await produce(lane.bootstrap, lane.control, [encode(later)])
        assert (await inbox.next()).command == Rollback()

    assert inbox.mailbox.empty(), "nothing refused reached the supervisor"
    assert control.refused == 6
    events = [event for _, event in refusals]
    assert all(isinstance(e, CommandRefused) for e in events)
    assert all(e.worker == config.worker_id for e in events)
    got = [(e.command, e.reason.split(":")[0]) for e in events]
    assert got == [
        ("unsigned", "unsigned"),
        ("wrong-secret", "bad_signature"),
        ("stale", "stale"),
        ("good", "replayed"),
        (None, "malformed"),
        (None, "malformed"),  # a tombstone
    ]
    record = refusals[0][0]
    assert record.key == config.worker_id.encode()
    assert h.header(record.headers, h.CONTENT_TYPE) == b"application/json"


async def test_a_worker_without_a_secret_refuses_everything(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    inbox = Inbox()
    async with running_control(lane.worker_config(control_secret=None), inbox):
        signed = sign_command(Status(), lane.secret, now=time.time())
        await produce(lane.bootstrap, lane.control, [encode(signed)])
        ((_, event),) = await read_events(lane.bootstrap, lane.events, until=1)
    assert isinstance(event, CommandRefused)
    assert event.reason.startswith("no_secret:") and event.command == signed.nonce
    assert inbox.mailbox.empty()


async def test_the_clock_decides_what_is_stale(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    inbox = Inbox()
    async with running_control(lane.worker_config(), inbox, clock=lambda: 10_000.0):
        fresh = sign_command(Status(), lane.secret, now=9_990.0)
        await produce(lane.bootstrap, lane.control, [encode(fresh)])
        assert (await inbox.next()).nonce == fresh.nonce


async def test_events_in_the_mailbox_are_published_before_stop_returns(
    kafka_bootstrap: str,
) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()
    reply = StatusReply(
        worker=config.worker_id, at=time.time(), command="n1",
        model=ModelRef(name="tiny", digest="sha256:" + "ab" * 32),
        uptime_s=1.0, queued=0, running=0, kv_blocks_used=1, kv_blocks_total=8,
    )  # fmt: skip
    draining = WorkerDraining(worker=config.worker_id, at=time.time(), reason="x", in_flight=0)
    async with running_control(config, Inbox()) as control:
        await control.publish(reply)
        await control.send(draining)
        # running_control stops it at once: both must still go out, in order.
    assert control.published == 2
    events = [e for _, e in await read_events(lane.bootstrap, lane.events, until=2)]
    assert events == [reply, draining]


async def test_it_runs_again_after_a_crash(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()

    class Flaky(Inbox):
        failures = 1

        async def send(self, message: VerifiedCommand) -> None:
            if self.failures:
                self.failures -= 1
                raise RuntimeError("supervisor gone")
            await super().send(message)

    inbox = Flaky()
    control = ControlActor(config, inbox)
    first = asyncio.create_task(control.run())
    async with asyncio.timeout(60):
        await control.ready.wait()
    first_command = sign_command(Status(), lane.secret, now=time.time())
    await produce(lane.bootstrap, lane.control, [encode(first_command)])
    with pytest.raises(ExceptionGroup) as crashed:
        async with asyncio.timeout(30):
            await first
    assert crashed.group_contains(RuntimeError, match="supervisor gone")
    assert not control.ready.is_set()

    second = asyncio.create_task(control.run())  # what the supervisor does
    try:
        async with asyncio.timeout(60):
            await control.ready.wait()
        signed = sign_command(Rollback(), lane.secret, now=time.time())
        await produce(lane.bootstrap, lane.control, [encode(signed)])
        assert await inbox.next() == VerifiedCommand(Rollback(), signed.nonce)
    finally:
        control.stop()
        async with asyncio.timeout(30):
            await second
