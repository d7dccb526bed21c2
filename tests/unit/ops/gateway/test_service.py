"""Admission (`--max-inflight` places, each released once) and what a stream's chunks say."""

from __future__ import annotations

import asyncio
import json

import pytest

from messages.chunk import GenerateChunk
from messages.openai_batch import COMPLETIONS_URL
from messages.result import FinishReason, GenerateResult
from ops.gateway.bodies import to_asked
from ops.gateway.errors import ApiError
from ops.gateway.outcomes import Streaming
from ops.gateway.replies import Reply
from ops.gateway.service import Gateway
from ops.gateway.settings import GatewaySettings
from ops.gateway.sse import DONE


def gateway(max_inflight: int) -> Gateway:
    return Gateway(GatewaySettings(max_inflight=max_inflight), None, "t")  # type: ignore[arg-type]


def test_past_max_inflight_is_429_until_a_place_is_released() -> None:
    g = gateway(1)
    place = g.admit()
    with pytest.raises(ApiError) as caught:
        g.admit()
    assert caught.value.status == 429
    place.release()
    g.admit()


def test_a_place_is_released_once_however_often_asked() -> None:
    g = gateway(2)
    first, _second = g.admit(), g.admit()
    first.release()
    first.release()
    assert g.in_flight == 1


def test_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="max-inflight"):
        GatewaySettings(max_inflight=0)
    with pytest.raises(ValueError, match="instance-id"):
        GatewaySettings(instance_id="a/b")
    assert GatewaySettings().reply_topic("x1") == "tokenmill.gateway.x1.results"


class AnsweringReplies:
    """`Replies` whose every request is answered at once with one chunk and the result."""

    def open(self, request_id: str) -> asyncio.Queue[Reply]:
        queue: asyncio.Queue[Reply] = asyncio.Queue()
        queue.put_nowait(GenerateChunk(id=request_id, token_ids=[7], text="Hi"))
        queue.put_nowait(
            GenerateResult(id=request_id, text="Hi", token_ids=[7], finish_reason=FinishReason.STOP)
        )
        return queue

    async def send(self, request: object, trace: object) -> None:
        pass

    def close(self, request_id: str) -> None:
        pass


@pytest.mark.parametrize(("named", "shown"), [(None, "served-one"), ("asked", "asked")])
async def test_stream_chunks_carry_the_body_s_model_else_the_one_the_fleet_serves(
    named: str | None, shown: str
) -> None:
    service = Gateway(GatewaySettings(), AnsweringReplies(), "t")  # type: ignore[arg-type]
    body = {"prompt": "Say hi", "stream": True} | ({"model": named} if named else {})
    asked = to_asked(COMPLETIONS_URL, body, "gw-t-1")
    started = await service.stream(asked, [], service.admit(), "served-one")
    assert isinstance(started, Streaming)
    events = [started.first] + [event async for event in started.events]
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events if e != DONE]
    assert chunks and {c["model"] for c in chunks} == {shown}
