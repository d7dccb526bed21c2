"""Property: whatever the sizes of a record's fields, it gets exactly one answer and the worker
stays up. Records are generated around every documented limit (id, key, metadata, stop
strings, the request's size) and with reply_to values that must not or cannot be written."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.limits import (
    MAX_ID_BYTES,
    MAX_KEY_BYTES,
    MAX_METADATA_CHARS,
    MAX_METADATA_ENTRIES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
)
from tests.integration.pipeline import decode_results as decode
from tests.integration.pipeline import (
    new_lane,
    produce,
    read_all,
    running_worker,
    wait_committed_to_end,
)

pytestmark = pytest.mark.slow

MAX_REQUEST_BYTES = 64 << 10  # the worker's limit in this test: records around it are cheap


def around(limit: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(0, 8), st.integers(limit - 2, limit + 2), st.integers(0, limit * 2)
    )


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes | None, bytes]:
    body: dict[str, Any] = {
        "prompt_token_ids": [5, 6, 7],
        "max_new_tokens": draw(st.integers(1, 4)),
    }
    if draw(st.booleans()):
        body["id"] = draw(st.sampled_from(["a", "é", "\x01"])) * draw(around(MAX_ID_BYTES))
    if draw(st.booleans()):
        entries = draw(around(MAX_METADATA_ENTRIES))
        size = draw(around(MAX_METADATA_CHARS)) // max(entries, 1) // 2
        body["metadata"] = {f"{i:04d}" + "k" * size: "v" * size for i in range(entries)}
    if draw(st.booleans()):
        body["stop"] = ["s" * max(draw(around(MAX_STOP_CHARS)), 1)] * draw(around(MAX_STOP_STRINGS))
    if draw(st.booleans()):
        body["reply_to"] = draw(
            st.sampled_from(
                ["__consumer_offsets", "tokenmill.requests", "no-such.results", "bad name"]
            )
        )
    if draw(st.booleans()):
        body["padding"] = "p" * draw(around(MAX_REQUEST_BYTES))  # an unknown field, ignored
    key = draw(st.one_of(st.none(), st.binary(min_size=0, max_size=8).map(lambda b: b or None)))
    if draw(st.booleans()):
        key = b"k" * draw(around(MAX_KEY_BYTES))
    return key, msgspec.json.encode(body)


async def one_answer_each(
    bootstrap: str, engine: Engine, batch: list[tuple[bytes | None, bytes]]
) -> None:
    lane = await new_lane(bootstrap, partitions=1)
    config = lane.worker_config(max_request_bytes=MAX_REQUEST_BYTES)
    async with running_worker(config, engine) as worker:
        await produce(
            lane.bootstrap, lane.requests, [v for _, v in batch], keys=[k for k, _ in batch]
        )
        await wait_committed_to_end(lane, within_s=120)
        assert not worker.supervisor.down and worker.supervisor.exit_code == 0
    results = decode(await read_all(lane.bootstrap, lane.results, until=len(batch), within_s=60))
    offsets = sorted(r.source.offset for r in results if r.source is not None)
    assert offsets == list(range(len(batch))), "exactly one answer per record"


@pytest.fixture(scope="module")
def engine(tiny_checkpoints) -> Engine:
    return Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(batch=st.lists(records(), min_size=10, max_size=25))
def test_every_record_gets_exactly_one_answer_whatever_its_sizes(
    kafka_bootstrap: str, engine: Engine, batch: list[tuple[bytes | None, bytes]]
) -> None:
    asyncio.run(one_answer_each(kafka_bootstrap, engine, batch))
