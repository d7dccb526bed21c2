"""Records as clients other than aiokafka write them: header keys of raw bytes.

librdkafka's C API, the Java and the Go clients take a header key as bytes, and brokers store
whatever they are given; aiokafka writes only `str` keys, and confluent-kafka's Python binding
turns a `bytes` key into its `repr`. So the batch is built here with aiokafka's own batch API,
placeholder keys of the same length in place, then the placeholders are replaced by the raw
bytes and the batch's CRC made right again, exactly what such a client would have sent.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.record.util import calc_crc32c

# (key, value, headers) where a header key may be raw bytes
Record = tuple[bytes | None, bytes | None, Sequence[tuple[str | bytes, bytes]]]

_CRC_AT, _CRC_FROM = 17, 21  # where a v2 batch's CRC sits, and where the bytes it covers start


async def produce_raw_batch(
    bootstrap: str, topic: str, records: Sequence[Record], *, partition: int = 0
) -> None:
    """Send `records` as one uncompressed batch to `partition` of `topic`."""
    placeholders: dict[bytes, bytes] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        batch = producer.create_batch()
        for key, value, headers in records:
            named = []
            for name, header_value in headers:
                if isinstance(name, bytes):
                    if len(name) < 8:
                        raise ValueError("a raw header key needs 8 bytes or more here")
                    # ASCII of the same length, unique, and unlikely anywhere else in the batch
                    stand_in = f"\x01{len(placeholders):07d}".ljust(len(name), "\x01")
                    placeholders[stand_in.encode()] = name
                    name = stand_in
                named.append((name, header_value))
            assert batch.append(key=key, value=value, timestamp=None, headers=named) is not None
        raw = bytearray(batch._build())
        for stand_in, name in placeholders.items():
            assert raw.count(stand_in) == 1, "a placeholder collides with the records' bytes"
            raw = raw.replace(stand_in, name)
        struct.pack_into(">I", raw, _CRC_AT, calc_crc32c(bytes(raw[_CRC_FROM:])))
        batch._buffer = bytes(raw)
        await (await producer.send_batch(batch, topic, partition=partition))
    finally:
        await producer.stop()
