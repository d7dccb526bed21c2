"""ControlActor: signed commands in from the control topic, the worker's events out.

Reads the control topic in a consumer group of its own (`<group>.control.<worker id>`), so
every worker sees every command; a new group starts at the topic's end. Each record is
decoded and verified (`messages.signing`): a good command goes to the supervisor as a
`VerifiedCommand`; anything else becomes a `CommandRefused` event and a warning, never a
crash. Accepted nonces outlive a restart of the actor, so a record read twice is applied once.

Mailbox: `Event`s to publish on the events topic (JSON, keyed by worker id), in order.
Sends: `VerifiedCommand` to `commands`. `ready` is set once the consumer's positions are
resolved: a command produced after that is seen. `stop()`: stop reading, publish every event
still in the mailbox, wait for the broker's acknowledgements, close. `run()` may be called
again after it raised; it makes fresh Kafka clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import msgspec
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from actors.config import WorkerConfig
from actors.kafka.broker_wait import started
from actors.kafka.consumers import control_consumer
from actors.kafka.partition_reader import Consumer, PartitionReader
from actors.mail import VerifiedCommand
from actors.runtime import Actor, Address, Mailbox
from actors.telemetry.lifecycle_spans import record_event_span
from messages import headers as h
from messages.codec import JSON
from messages.events import CommandRefused, Event
from messages.signing import CommandRefusedError, NonceCache, decode_signed, verify_command

log = structlog.get_logger("tokenmill.control")

_EVENT_SCHEMA = b"Event/1"
_encoder = msgspec.json.Encoder()


class ControlActor(Actor[Event]):
    MAILBOX_SIZE = 256

    def __init__(
        self,
        config: WorkerConfig,
        commands: Address[VerifiedCommand],
        mailbox: Mailbox[Event] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        consumer: Callable[[], Consumer] | None = None,
    ) -> None:
        """`commands`: the supervisor's mailbox, where verified commands go; `mailbox`: this
        actor's own, where every actor's events arrive for the events topic; `consumer`: makes
        the control topic's consumer (default: `actors.kafka.consumers`)."""
        super().__init__("control", mailbox or Mailbox(self.MAILBOX_SIZE))
        if config.control_topic is None:
            raise ValueError("a ControlActor needs config.control_topic")
        self.config = config
        self.topic: str = config.control_topic
        self.commands = commands
        self.clock = clock
        self.ready = asyncio.Event()
        self.nonces = NonceCache()
        self.accepted = 0
        self.refused = 0
        self.published = 0
        self.make_consumer = consumer or (lambda: control_consumer(config))

    @property
    def listening(self) -> bool:
        """Assigned the control topic and able to publish events (for readiness)."""
        return self.ready.is_set()

    async def publish(self, event: Event) -> None:
        """Queue `event` for the events topic (the same as `send`)."""
        await self.send(event)

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self.config.kafka.producer_kwargs(),
            client_id=f"tokenmill-{self.config.worker_id}-events",
            acks="all",
            enable_idempotence=True,
        )

    async def run(self) -> None:
        self.ready.clear()
        async with contextlib.AsyncExitStack() as stack:
            producer = await started(
                self._new_producer, name="events", stopping=self.stopping, settings=self.config
            )
            if producer is None:
                return
            stack.push_async_callback(producer.stop)
            reader = PartitionReader(
                self.make_consumer,
                name="control",
                settings=self.config,
                stopping=self.stopping,
                failed_event="control_fetch_failed",
                ready=self.ready,
            )
            if await reader.open(self.topic) is None:
                return
            stack.push_async_callback(reader.close)
            log.info("control_started", topic=self.topic)
            try:
                async with asyncio.TaskGroup() as tg:
                    reading = tg.create_task(self._read_loop(reader))
                    positions = tg.create_task(
                        reader.keep_ready(lambda n: log.info("control_ready", partitions=n))
                    )
                    tg.create_task(self._publish_loop(producer))
                    await reading
                    positions.cancel()
                # Refusals queued by the last records read, after the publish loop ended.
                for event in self.drain_mailbox():
                    await self._publish(producer, event)
                await producer.flush()
            finally:
                self.ready.clear()
                log.info(
                    "control_stopped",
                    accepted=self.accepted,
                    refused=self.refused,
                    published=self.published,
                )

    # -- commands in -----------------------------------------------------------------------

    async def _read_loop(self, reader: PartitionReader) -> None:
        # A record no one can read (record_reader) reaches `_verdict` and is refused there.
        async for record in reader.records():
            await self._handle(record)

    def _verdict(self, value: bytes | None) -> VerifiedCommand | CommandRefusedError:
        """What to do with one control record's value: the decision, without the effects."""
        try:
            signed = decode_signed(value or b"")
            command = verify_command(
                signed, self.config.control_secret, now=self.clock(), nonces=self.nonces
            )
        except CommandRefusedError as exc:
            return exc
        return VerifiedCommand(command=command, nonce=signed.nonce)

    async def _handle(self, record: ConsumerRecord[bytes, bytes]) -> None:
        """Hand a verified command to the supervisor, or publish why it was refused."""
        with structlog.contextvars.bound_contextvars(
            topic=record.topic, partition=record.partition, offset=record.offset
        ):
            verdict = self._verdict(record.value)
            if isinstance(verdict, VerifiedCommand):
                self.accepted += 1
                kind = type(verdict.command).__name__
                log.info("command_accepted", command=kind, nonce=verdict.nonce)
                await self.commands.send(verdict)
                return
            self.refused += 1
            log.warning(
                "command_refused", reason=verdict.reason, detail=verdict.detail, nonce=verdict.nonce
            )
            refusal = CommandRefused(
                worker=self.config.worker_id,
                at=self.clock(),
                reason=f"{verdict.reason}: {verdict.detail}",
                command=verdict.nonce,
            )
            record_event_span(refusal)
            await self.send(refusal)

    # -- events out ------------------------------------------------------------------------

    async def _publish_loop(self, producer: AIOKafkaProducer) -> None:
        while (event := await self.receive()) is not None:
            await self._publish(producer, event)

    async def _publish(self, producer: AIOKafkaProducer, event: Event) -> None:
        await producer.send_and_wait(
            self.config.events_topic,
            value=_encoder.encode(event),
            key=self.config.worker_id.encode(),
            headers=[(h.CONTENT_TYPE, JSON.encode()), (h.SCHEMA, _EVENT_SCHEMA)],
        )
        self.published += 1
