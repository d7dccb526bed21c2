"""Producing `CancelRequest`s: one record per request id, keyed by it, on the cancel topic.

    async with CancelSender(kafka, "tokenmill.cancel") as sender:
        await sender.cancel(["job-1", "job-2"], reason="user")

Every worker reads the cancel topic, so the record reaches whichever worker holds the
request; the request's result (finish_reason "cancelled") comes on its reply topic as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import TracebackType

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from actors.config import DEFAULT_CANCEL_TOPIC
from actors.kafka.connection import KafkaConnection, connection_of
from messages import headers as h
from messages.cancel import CANCEL_SCHEMA, CancelRequest, cancel_codec
from messages.codec import JSON
from ops.connection.check import started_producer
from ops.errors import CancelError

_HEADERS = [(h.CONTENT_TYPE, JSON.encode()), (h.SCHEMA, CANCEL_SCHEMA.encode())]


class CancelSender:
    def __init__(self, kafka: KafkaConnection | str, topic: str = DEFAULT_CANCEL_TOPIC) -> None:
        self.kafka = connection_of(kafka)
        self.topic = topic
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> CancelSender:
        self._producer = await started_producer(self.kafka, CancelError)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def cancel(self, request_ids: Iterable[str], *, reason: str = "") -> int:
        """Produce one cancel per id and wait for the broker's acknowledgements; how many."""
        producer = self._producer
        if producer is None:
            raise RuntimeError("CancelSender is used outside `async with`")
        try:
            sent = [
                await producer.send(
                    self.topic,
                    value=cancel_codec.encode(CancelRequest(id=request_id, reason=reason)),
                    key=request_id.encode(),
                    headers=_HEADERS,
                )
                for request_id in request_ids
            ]
            await asyncio.gather(*sent)
        except KafkaError as exc:
            raise CancelError(
                f"cannot send to topic {self.topic!r} ({exc!r}); run `tokenmill topics create`"
            ) from exc
        return len(sent)
