"""Every kind of bad input, interleaved with good requests, through a real broker.

Each bad record gets its own typed error result; the undecodable ones also land on the DLQ
with headers naming why and where they came from; the good ones get results; the committed
offsets reach the end of every partition (no offset skipped, none stuck).
"""

from __future__ import annotations

import asyncio
import random

from confluent_kafka import Producer

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages import headers as h
from messages.error_codes import DEAD_LETTER_CODES, ErrorCode
from tests.integration.pipeline import (
    Lane,
    new_lane,
    produce,
    read_all,
    results_by_id,
    running_worker,
    wait_committed_to_end,
)

# key → (record value, the error code its result must carry; None for success)
BAD: dict[str, tuple[bytes, ErrorCode | None]] = {
    "not-json": (b'{"id": "not-json", "prompt": ', ErrorCode.INVALID_JSON),
    "array": (b"[1, 2, 3]", ErrorCode.INVALID_JSON),
    "garbage": (random.Random(0).randbytes(256), ErrorCode.INVALID_ENCODING),
    "wrong-type": (b'{"id": "wrong-type", "prompt": "hi", "max_new_tokens": "x"}',
                   ErrorCode.SCHEMA_VIOLATION),
    "no-id": (b'{"prompt": "hi"}', ErrorCode.MISSING_ID),
    "empty-id": (b'{"id": "", "prompt": "hi"}', ErrorCode.MISSING_ID),
    "both": (b'{"id": "both", "prompt": "hi", "prompt_token_ids": [1, 2]}',
             ErrorCode.INVALID_PROMPT),
    "neither": (b'{"id": "neither"}', ErrorCode.INVALID_PROMPT),
    "empty-prompt": (b'{"id": "empty-prompt", "prompt": ""}', ErrorCode.EMPTY_PROMPT),
    "too-long": (b'{"id": "too-long", "prompt": "' + b"word " * 3000 + b'"}',
                 ErrorCode.PROMPT_TOO_LONG),
    "zero-tokens": (b'{"id": "zero-tokens", "prompt": "hi", "max_new_tokens": 0}',
                    ErrorCode.INVALID_MAX_TOKENS),
    "many-tokens": (b'{"id": "many-tokens", "prompt": "hi", "max_new_tokens": 100000}',
                    ErrorCode.MAX_TOKENS_TOO_LARGE),
    "cold": (b'{"id": "cold", "prompt": "hi", "temperature": -0.5}',
             ErrorCode.INVALID_SAMPLING_PARAMS),
    "top-p-zero": (b'{"id": "top-p-zero", "prompt": "hi", "top_p": 0}',
                   ErrorCode.INVALID_SAMPLING_PARAMS),
    "top-p-big": (b'{"id": "top-p-big", "prompt": "hi", "top_p": 1.5}',
                  ErrorCode.INVALID_SAMPLING_PARAMS),
    "other-model": (b'{"id": "other-model", "prompt": "hi", "model": "gpt-17"}',
                    ErrorCode.UNKNOWN_MODEL),
    "bad-token": (b'{"id": "bad-token", "prompt_token_ids": [1, 99999]}',
                  ErrorCode.TOKEN_OUT_OF_VOCABULARY),
    "expired": (b'{"id": "expired", "prompt": "hi", "deadline": "2001-01-01T00:00:00Z"}',
                ErrorCode.DEADLINE_EXCEEDED),
    "huge": (b'{"id": "huge", "prompt": "' + b"x" * (10 << 20) + b'"}',
             ErrorCode.MESSAGE_TOO_LARGE),
    "huge-top-k": (b'{"id": "huge-top-k", "prompt": "hi", "temperature": 1, '
                   b'"top_k": 9223372036854775808}', ErrorCode.INVALID_SAMPLING_PARAMS),
    "bad-reply": (b'{"id": "bad-reply", "prompt": "hi", "reply_to": "no such topic!"}',
                  ErrorCode.INVALID_REPLY_TO),
    # Unknown fields are ignored, whatever their type: forward compatibility.
    "unknown-field": (b'{"id": "unknown-field", "prompt_token_ids": [5, 6], '
                      b'"max_new_tokens": 2, "future": {"x": [1, 2]}}', None),
}  # fmt: skip


def produce_null_record(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic)
    assert producer.flush(30) == 0


def good(i: int) -> bytes:
    return b'{"id": "good-%d", "prompt_token_ids": [%d, 7, 9], "max_new_tokens": 3}' % (i, i + 3)


async def test_every_bad_input_gets_its_typed_error(kafka_bootstrap, tiny_checkpoints) -> None:
    lane: Lane = await new_lane(kafka_bootstrap, partitions=3)
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())

    keys: list[bytes] = []
    values: list[bytes] = []
    for i, (key, (value, _)) in enumerate(BAD.items()):
        keys += [key.encode(), b"good-%d" % i]
        values += [value, good(i)]
    await produce(lane.bootstrap, lane.requests, values, keys=keys)
    await produce(
        lane.bootstrap,
        lane.requests,
        [b'{"id": "xml", "prompt": "hi"}'],
        keys=[b"xml"],
        headers=[(h.CONTENT_TYPE, b"application/xml")],
    )
    # A record with neither key nor value: aiokafka refuses to write one, librdkafka can.
    await asyncio.to_thread(produce_null_record, lane.bootstrap, lane.requests)
    expected = {k: code for k, (_, code) in BAD.items()}
    expected[""] = ErrorCode.INVALID_JSON
    expected["xml"] = ErrorCode.UNSUPPORTED_CONTENT_TYPE
    expected |= {f"good-{i}": None for i in range(len(BAD))}

    async with running_worker(lane.worker_config(), engine) as worker:
        found = await results_by_id(lane, expected)
        committed = await wait_committed_to_end(lane)
        ingest = worker.ingest

    assert sorted(found) == sorted(expected), "every record has a result keyed by id or key"
    for request_id, code in expected.items():
        (result,) = found[request_id]  # exactly one
        if code is None:
            assert result.error is None, (request_id, result.error)
            assert result.token_ids and result.finish_reason in ("length", "stop")
        else:
            assert result.error is not None, request_id
            assert result.error.code == code, (request_id, result.error)
            assert result.error.message
            assert result.source is not None and result.source.topic == lane.requests

    dead = {k for k, code in expected.items() if code in DEAD_LETTER_CODES}
    letters = await read_all(lane.bootstrap, lane.dlq, until=len(dead))
    assert {(r.key or b"").decode() for r in letters} == dead
    for letter in letters:
        names = dict(letter.headers)
        assert names[h.DLQ_ERROR_CODE].decode() == expected[(letter.key or b"").decode()]
        assert names[h.DLQ_SOURCE_TOPIC].decode() == lane.requests
        assert int(names[h.DLQ_SOURCE_OFFSET]) >= 0
        if letter.key == b"huge":  # cut to the request limit; the header keeps the size
            assert names[h.DLQ_TRUNCATED_FROM] == str(len(BAD["huge"][0])).encode()
            assert BAD["huge"][0].startswith(letter.value)
        elif letter.key is None:
            assert letter.value == b""
        elif letter.key != b"xml":
            assert letter.value == BAD[letter.key.decode()][0]

    every = await read_all(lane.bootstrap, lane.results, until=len(expected) + 1, within_s=5)
    assert len(every) == len(expected), "exactly one result per record"
    total = len(expected)
    assert ingest.records_read == total
    assert sum(committed.values()) == total, "commits reached the end of every partition"
