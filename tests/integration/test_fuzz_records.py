"""Thousands of seeded random records through a real broker: each is answered exactly once
(a result naming its source offset), the undecodable ones dead-lettered exactly once, and the
worker stays up with no actor restarted.

Keys, header keys (raw bytes among them, as non-Python clients write them), header values and
values are random: bytes, JSON and MessagePack of request-like shapes with random types in
known fields, huge integers, deep nesting, repeated keys.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages import headers as h
from messages.error_codes import DEAD_LETTER_CODES
from tests.integration.foreign_records import produce_raw_batch
from tests.integration.pipeline import decode_results, new_lane, read_all, running_worker

RECORDS = 2000
BATCH = 50
SEED = 34

_JSON, _MSGPACK = b"application/json", b"application/msgpack"
_FIELDS = ("prompt", "prompt_token_ids", "messages", "max_new_tokens", "temperature", "top_p",
           "top_k", "seed", "stop", "stop_token_ids", "priority", "timeout_ms", "deadline",
           "metadata", "response_format", "stream_interval_ms", "v", "model")  # fmt: skip


def _scalar(rng: random.Random) -> Any:
    return rng.choice([
        None, True, 0, -1, 1, 2**63, -(2**63) - 1, 10**rng.randint(20, 300), 0.5, -0.0,
        1e308, 1e-320, "", "x" * rng.randint(1, 64), "\u0000\ud7ff", [], {},
    ])  # fmt: skip


def _nested(rng: random.Random, depth: int) -> Any:
    value: Any = _scalar(rng)
    for _ in range(depth):
        value = {"type": "object", "properties": {"a": value}} if rng.random() < 0.5 else [value]
    return value


def _request_like(rng: random.Random, i: int) -> dict[str, Any]:
    body: dict[str, Any] = {"id": f"r{i}"} if rng.random() < 0.9 else {}
    if rng.random() < 0.5:  # a request that runs
        body |= {"prompt_token_ids": [rng.randint(1, 200) for _ in range(rng.randint(1, 6))],
                 "max_new_tokens": rng.randint(1, 3)}  # fmt: skip
    for name in rng.sample(_FIELDS, rng.randint(0, 4)):
        body[name] = _scalar(rng)
    if rng.random() < 0.1:
        schema = _nested(rng, rng.choice([1, 5, 100, 1200]))
        body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    return body


def _value(rng: random.Random, i: int) -> tuple[bytes | None, bytes | None]:
    """(value, content-type)"""
    kind = rng.random()
    if kind < 0.05:
        return None, None
    if kind < 0.15:
        return rng.randbytes(rng.randint(0, 200)), rng.choice([None, _JSON, _MSGPACK, b"\xff"])
    body = _request_like(rng, i)
    if kind < 0.6:
        try:
            text = json.dumps(body)
        except (ValueError, RecursionError):
            text = "{}"
        if rng.random() < 0.05:  # a repeated key: the last would win in most parsers
            text = '{"id": "first", ' + text[1:]
        return text.encode(), rng.choice([None, _JSON])
    try:
        return msgspec.msgpack.encode(body), _MSGPACK
    except (OverflowError, RecursionError, msgspec.EncodeError):
        return msgspec.msgpack.encode({"id": f"r{i}"}), _MSGPACK


def _record(rng: random.Random, i: int) -> tuple[bytes | None, bytes | None, list[Any]]:
    value, ctype = _value(rng, i)
    headers: list[tuple[str | bytes, bytes]] = []
    if ctype is not None:
        headers.append((h.CONTENT_TYPE, ctype))
    for _ in range(rng.choice([0, 0, 1, 3])):
        key: str | bytes = (
            rng.randbytes(rng.randint(8, 16)) if rng.random() < 0.3 else f"h{rng.randint(0, 9)}"
        )
        if isinstance(key, bytes) and key.isascii() and b"\x00" not in key:
            key = key + b"\xff"  # raw bytes that are not UTF-8
        headers.append((key, rng.randbytes(rng.randint(0, 16))))
    key_bytes = rng.choice([None, f"r{i}".encode(), rng.randbytes(rng.randint(0, 40))])
    return key_bytes, value, headers


async def test_random_records_are_each_answered_exactly_once(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path]
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    rng = random.Random(SEED)
    records = [_record(rng, i) for i in range(RECORDS)]
    for start in range(0, RECORDS, BATCH):
        await produce_raw_batch(
            lane.bootstrap, lane.requests, records[start : start + BATCH],
            partition=(start // BATCH) % 2,
        )  # fmt: skip

    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    async with running_worker(lane.worker_config(), engine) as worker:
        raw = await read_all(lane.bootstrap, lane.results, until=RECORDS, within_s=600)
    assert worker.supervisor.policy.total() == 0, "no actor restarted"
    assert worker.supervisor.exit_code == 0

    results = decode_results(raw)
    sources = Counter(
        (r.source.partition, r.source.offset) for r in results if r.source is not None
    )
    assert len(results) == RECORDS and len(sources) == RECORDS, "one result per record"
    assert set(sources.values()) == {1}
    codes = Counter(r.error.code.value if r.error else "ok" for r in results)
    assert codes["ok"] > 100, codes  # good requests ran among the bad ones
    dead = sum(1 for r in results if r.error is not None and r.error.code in DEAD_LETTER_CODES)
    letters = await read_all(lane.bootstrap, lane.dlq, until=dead, within_s=60)
    where = Counter(
        (dict(x.headers)[h.DLQ_SOURCE_PARTITION], dict(x.headers)[h.DLQ_SOURCE_OFFSET])
        for x in letters
    )
    assert len(letters) == dead and set(where.values()) <= {1}, "each dead letter once"
