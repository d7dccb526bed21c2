"""`tokenmill gateway` with the official `openai` SDK as the client: the gateway runs in this
process (uvicorn on a free port), a SmolLM2 worker as a subprocess on the session broker. Its
answers equal the worker's direct answers (the same requests, mapped by the batch mapper,
produced straight to Kafka) for the same greedy requests."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL
from ops.services.topics import create_topics
from tests.integration.gateway_fleet import KEY, MODEL, Fleet, client, direct_text, gateway
from tests.integration.pipeline import REPO, WorkerProcess, new_lane

pytestmark = pytest.mark.slow


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Greedy on purpose: an omitted temperature is the model's recommended, else 1.0 (sampled).
CHAT = {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
TEXT = {
    "model": MODEL,
    "prompt": "The three primary colors are",
    "max_tokens": 10,
    "temperature": 0,
}


async def test_completions_and_chat_plain_and_streamed_equal_the_direct_answers(
    fleet: Fleet,
) -> None:
    want_chat = await direct_text(fleet, CHAT_COMPLETIONS_URL, CHAT)
    want_text = await direct_text(fleet, COMPLETIONS_URL, TEXT)
    async with gateway(fleet) as base, client(base) as api:
        chat = await api.chat.completions.create(**CHAT)
        assert chat.object == "chat.completion"
        assert chat.choices[0].message.content == want_chat
        assert chat.model == MODEL and chat.usage is not None and chat.usage.completion_tokens > 0

        text = await api.completions.create(**TEXT)
        assert text.choices[0].text == want_text

        pieces, usage, finish = [], None, None
        stream = await api.chat.completions.create(
            **CHAT, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert "".join(pieces) == want_chat
        assert finish in ("stop", "length")
        assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens

        streamed = await api.completions.create(**TEXT, stream=True)
        assert "".join([c.choices[0].text async for c in streamed if c.choices]) == want_text


async def test_models_lists_what_the_worker_announced(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        deadline = time.monotonic() + 60
        while not (models := [m.id for m in (await api.models.list()).data]):
            assert time.monotonic() < deadline, "no model listed from the events topic"
            await asyncio.sleep(0.2)  # the gateway is reading the events topic
        assert models == [MODEL]


async def test_a_wrong_key_is_401_and_a_bad_request_400_with_the_door_s_code(
    fleet: Fleet,
) -> None:
    async with (
        gateway(fleet, keys=(KEY.encode(),), events_topic="") as base,  # no fleet: all sent
        client(base) as api,
        client(base, key="sk-wrong") as stranger,
    ):
        with pytest.raises(openai.AuthenticationError) as denied:
            await stranger.completions.create(**TEXT)
        assert denied.value.code == "invalid_api_key"
        with pytest.raises(openai.BadRequestError) as refused:
            await api.completions.create(**{**TEXT, "temperature": -1})
        assert refused.value.code == "invalid_sampling_params"
        ignoring = await api.completions.with_raw_response.create(
            **TEXT, extra_body={"frobnicate": True, "zeta": 1}
        )
        assert ignoring.headers["x-tokenmill-ignored-fields"] == "frobnicate,zeta"
        assert ignoring.parse().choices[0].text
        with pytest.raises(openai.NotFoundError) as unknown:  # the worker's refusal: 404
            await api.completions.create(**{**TEXT, "model": "no-such-model"})
        assert unknown.value.code == "unknown_model"
    async with gateway(fleet, strict_fields=True) as base, client(base) as api:
        with pytest.raises(openai.BadRequestError) as unsupported:
            await api.completions.create(**TEXT, extra_body={"frobnicate": True})
        assert (unsupported.value.code, unsupported.value.param) == (
            "unsupported_parameter",
            "frobnicate",
        )


LONG = {
    "model": MODEL,
    "prompt": "1, 2, 3, 4,",
    "max_tokens": 400,
    "extra_body": {"min_tokens": 400},  # no early stop: it is still running when we look
}


async def test_past_max_inflight_is_429_with_retry_after(fleet: Fleet) -> None:
    async with gateway(fleet, max_inflight=1) as base, client(base) as api:
        stream = await api.completions.create(**LONG, stream=True)
        first = await anext(aiter(stream))  # in flight now
        with pytest.raises(openai.RateLimitError) as limited:
            await api.completions.create(**TEXT)
        assert limited.value.response.headers["retry-after"] == "1"
        assert limited.value.code == "rate_limit_exceeded"
        await stream.close()
        await wait_for_cancel(fleet, first.id.removeprefix("cmpl-"))


async def test_a_client_that_leaves_mid_stream_cancels_its_request(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count from 1 to 1000."}],
            max_tokens=400,
            extra_body={"min_tokens": 400},
            stream=True,
        )
        texts = []
        async for chunk in stream:
            texts.append(chunk.choices[0].delta.content or "")
            if "".join(texts):
                break  # text is coming: the worker is decoding it
        await stream.close()
        await wait_for_cancel(fleet, chunk.id.removeprefix("chatcmpl-"))


async def test_a_client_that_leaves_before_its_answer_cancels_its_request(fleet: Fleet) -> None:
    before = cancels_for_leaving(fleet)
    async with gateway(fleet) as base, client(base) as api:
        with pytest.raises(openai.APITimeoutError):  # the SDK gives up and closes
            await api.with_options(timeout=3.0).completions.create(**LONG)
        deadline = time.monotonic() + 120
        while cancels_for_leaving(fleet) == before:
            assert time.monotonic() < deadline, "no cancel of the request the client left"
            await asyncio.sleep(0.2)  # polling the worker's log file


def cancels_for_leaving(fleet: Fleet) -> int:
    return sum(
        "request_cancelled" in line and "client_disconnected" in line
        for line in fleet.worker.log().splitlines()
    )


async def wait_for_cancel(fleet: Fleet, request_id: str, within_s: float = 120.0) -> None:
    """Until the worker logs that it cancelled `request_id` (the cancel record reached it)."""
    deadline = time.monotonic() + within_s
    while not any(
        "request_cancelled" in line and request_id in line
        for line in fleet.worker.log().splitlines()
    ):
        assert time.monotonic() < deadline, f"no cancel of {request_id} in the worker log"
        await asyncio.sleep(0.2)  # polling the worker's log file


async def test_past_the_request_timeout_is_504_and_the_request_is_cancelled(fleet: Fleet) -> None:
    async with gateway(fleet, request_timeout=1.0) as base, client(base) as api:
        with pytest.raises(openai.APIStatusError) as late:
            await api.completions.create(**LONG)
        assert (late.value.status_code, late.value.code) == (504, "timeout")
        await wait_for_cancel(fleet, late.value.response.headers["x-request-id"])
        # The cancelled request's result comes back to no one: dropped, and counted.
        metrics = base.removesuffix("/v1") + "/metrics"
        deadline = time.monotonic() + 120
        while "tokenmill_gateway_results_dropped 1.0" not in await fetch(metrics):
            assert time.monotonic() < deadline, "the late result was never counted"
            await asyncio.sleep(0.2)  # the worker is sending the cancelled result


async def fetch(url: str) -> str:
    def get() -> str:
        with urllib.request.urlopen(url, timeout=30) as response:
            return str(response.read().decode())

    return await asyncio.to_thread(get)


async def test_a_body_over_max_body_bytes_is_413(fleet: Fleet) -> None:
    async with gateway(fleet, max_body_bytes=1000) as base, client(base) as api:
        with pytest.raises(openai.APIStatusError) as large:
            await api.completions.create(**{**TEXT, "prompt": "word " * 1000})
        assert (large.value.status_code, large.value.code) == (413, "request_too_large")


async def test_two_instances_and_two_workers_answer_each_request_to_the_instance_that_asked(
    fleet: Fleet, tmp_path: Path
) -> None:
    prefix = fleet.lane.requests.removesuffix(".requests")
    extra = ["--cancel-topic", fleet.cancel, "--events-topic", fleet.events,
             "--control-topic", f"{prefix}.control"]  # fmt: skip
    second_worker = WorkerProcess(fleet.lane, MODEL, tmp_path / "worker2.log", extra=extra)
    second_worker.start()
    try:
        # it has its share of the partitions (the group rebalanced) once it logs this
        await second_worker.wait_for_log("partitions_assigned", within_s=300)
        async with (
            gateway(fleet, instance_id="one") as first_base,
            gateway(fleet, instance_id="two") as second_base,
            client(first_base) as first,
            client(second_base) as second,
        ):
            prompts = [f"{n} + {n} =" for n in range(12)]
            asks = [
                api.completions.with_raw_response.create(
                    model=MODEL, prompt=p, max_tokens=2, temperature=0
                )
                for p in prompts
                for api in (first, second)
            ]
            raw = await asyncio.gather(*asks)
    finally:
        second_worker.close()
    for n, answered in enumerate(raw):  # even: asked of "one"; odd: of "two"
        assert answered.headers["x-request-id"].startswith(f"gw-{('one', 'two')[n % 2]}-")
    texts = [answered.parse().choices[0].text for answered in raw]
    assert all(texts)
    assert texts[0::2] == texts[1::2]  # the same greedy prompt, alike through either instance
    # 24 requests on 3 partitions shared by two workers: both answered some
    assert len({answered.headers["x-tokenmill-worker"] for answered in raw}) == 2


async def test_the_command_serves_until_sigterm_then_deletes_its_reply_topic(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap)
    log = tmp_path / "gateway.log"
    argv = [
        sys.executable, "-m", "ops", "gateway", "--bootstrap-servers", kafka_bootstrap,
        "--port", "0", "--requests-topic", lane.requests, "--events-topic", "",
        "--instance-id", "cli-test", "--batch-dir", str(tmp_path / "batches"),
    ]  # fmt: skip
    process = spawn(argv, log)
    try:
        deadline = time.monotonic() + 120
        while not (running := re.search(r"running on http://127.0.0.1:(\d+)", log.read_text())):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)  # the gateway is starting
        health = json.loads(await fetch(f"http://127.0.0.1:{running.group(1)}/healthz"))
        assert health["reply_topic"] == "tokenmill.gateway.cli-test.results"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert "gateway_reply_topic_deleted" in log.read_text()


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=out)


def test_the_command_refuses_a_broker_it_cannot_reach() -> None:
    argv = [sys.executable, "-m", "ops", "gateway", "--bootstrap-servers", "127.0.0.1:1"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "cannot reach Kafka at 127.0.0.1:1" in done.stderr


async def ready(base: str, reason: str | None = None) -> None:
    """Until `/readyz` is 200 (a live worker listed, the events topic read), or 503 for
    `reason`."""
    url = base.removesuffix("/v1") + "/readyz"

    def status() -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(url, timeout=30) as answered:
                return answered.status, json.loads(answered.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    deadline = time.monotonic() + 120
    while True:
        code, body = await asyncio.to_thread(status)
        if (code, body.get("reason")) == ((200, None) if reason is None else (503, reason)):
            return
        assert time.monotonic() < deadline, (code, body)
        await asyncio.sleep(0.2)  # the gateway is reading the events topic


async def test_a_model_card_has_max_model_len_and_an_unserved_model_is_503_no_worker(
    fleet: Fleet,
) -> None:
    async with gateway(fleet) as base, client(base) as api:
        await ready(base)
        card = await api.models.retrieve(MODEL)
        assert (card.id, card.object, card.owned_by) == (MODEL, "model", "tokenmill")
        max_model_len = (card.model_extra or {})["max_model_len"]
        assert isinstance(max_model_len, int) and max_model_len > 0
        [listed] = (await api.models.list()).data
        assert (listed.model_extra or {})["max_model_len"] == max_model_len
        with pytest.raises(openai.NotFoundError) as missing:
            await api.models.retrieve("no-such-model")
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.APIStatusError) as down:
            await api.chat.completions.create(**{**CHAT, "model": "no-such-model"})
        assert (down.value.status_code, down.value.code) == (503, "no_worker")
        assert int(down.value.response.headers["retry-after"]) > 0


async def test_with_no_worker_listed_readyz_and_every_request_are_503(fleet: Fleet) -> None:
    silent = f"{fleet.events}.silent"  # an events topic no worker publishes on
    await create_topics(fleet.lane.bootstrap, names={"events": silent})
    async with gateway(fleet, events_topic=silent) as base, client(base) as api:
        await ready(base, reason="no live worker is listed")
        for model in (MODEL, openai.NOT_GIVEN):  # the body names one, or none
            with pytest.raises(openai.APIStatusError) as down:
                await api.chat.completions.create(**{**CHAT, "model": model})
            assert (down.value.status_code, down.value.code) == (503, "no_worker")
        with pytest.raises(openai.APIStatusError) as down:
            await api.completions.create(**TEXT, stream=True)
        assert (down.value.status_code, down.value.code) == (503, "no_worker")


async def post_json(url: str, body: dict[str, Any]) -> Any:
    """POST `body` as JSON to `url`; the answer's JSON (an error status raises)."""

    def post() -> Any:
        asked = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(asked, timeout=60) as answered:
            return json.loads(answered.read())

    return await asyncio.to_thread(post)


async def test_tokenize_and_detokenize_round_trip_with_smollm2_s_tokenizer(fleet: Fleet) -> None:
    async with gateway(fleet) as base:
        await ready(base)
        root = base.removesuffix("/v1")
        text = "The capital of France is Paris."
        made = await post_json(f"{root}/tokenize", {"model": MODEL, "prompt": text})
        tokens = made["tokens"]
        assert made["count"] == len(tokens) > 0 and made["max_model_len"] > 0
        back = await post_json(f"{root}/detokenize", {"model": MODEL, "tokens": tokens})
        assert back == {"prompt": text}
        chat = await post_json(f"{root}/tokenize", {"messages": QUESTION})  # the model served
        rendered = await post_json(f"{root}/detokenize", {"tokens": chat["tokens"]})
        assert QUESTION[0]["content"] in rendered["prompt"]
        assert rendered["prompt"].rstrip().endswith("assistant"), "the generation prompt"


def chat_logprobs_of(choice: object) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """A choice's (or a chunk choice's) chat logprobs as plain tuples."""
    logprobs = getattr(choice, "logprobs", None)
    if logprobs is None or logprobs.content is None:
        return []
    return [
        (t.token, t.logprob, [(top.token, top.logprob) for top in t.top_logprobs])
        for t in logprobs.content
    ]


async def test_streams_carry_logprobs_choices_tool_calls_and_finish_with_the_last_text(
    fleet: Fleet,
) -> None:
    async with gateway(fleet) as base, client(base) as api:
        # n = 2 seeded choices with logprobs: each index's stream is its non-streamed choice
        asked = {
            **CHAT, "n": 2, "seed": 11, "temperature": 0.8, "logprobs": True, "top_logprobs": 2,
        }  # fmt: skip
        whole = await api.chat.completions.create(**asked)
        texts: dict[int, list[str]] = {0: [], 1: []}
        logprobs: dict[int, list] = {0: [], 1: []}
        finish: dict[int, str] = {}
        stream = await api.chat.completions.create(**asked, stream=True)
        async for chunk in stream:
            for choice in chunk.choices:
                assert choice.finish_reason is None or choice.index not in finish
                texts[choice.index].append(choice.delta.content or "")
                logprobs[choice.index] += chat_logprobs_of(choice)
                if choice.finish_reason is not None:
                    finish[choice.index] = choice.finish_reason
        for want in whole.choices:
            assert "".join(texts[want.index]) == want.message.content
            assert finish[want.index] == want.finish_reason
            got, expected = logprobs[want.index], chat_logprobs_of(want)
            assert [g[0] for g in got] == [e[0] for e in expected] and expected
            assert [g[1] for g in got] == pytest.approx([e[1] for e in expected], abs=1e-4)
            assert [[t for t, _ in g[2]] for g in got] == [[t for t, _ in e[2]] for e in expected]

        # completions: every chunk has text, and the last text carries the finish reason
        completions = [c async for c in await api.completions.create(**TEXT, stream=True)]
        joined = "".join(c.choices[0].text for c in completions)
        assert joined == (await api.completions.create(**TEXT)).choices[0].text
        *_, last = completions
        assert last.choices[0].finish_reason in ("stop", "length") and last.choices[0].text
        assert all(c.choices[0].finish_reason is None for c in completions[:-1])

        # a required tool call streams as tool-call pieces: the name, then the arguments
        tools = [{"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                           "properties": {"city": {"enum": ["Paris", "London"]}}},
        }}]  # fmt: skip
        call_body = {  # greedy: two sampled calls may pick different cities (they did once)
            "model": MODEL, "max_tokens": 60, "tools": tools, "tool_choice": "required",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "temperature": 0,
        }  # fmt: skip
        answered = await api.chat.completions.create(**call_body)
        calls = answered.choices[0].message.tool_calls or []
        assert len(calls) == 1, answered.choices[0]
        [want_call] = calls
        names, arguments, reasons = [], [], []
        async for chunk in await api.chat.completions.create(**call_body, stream=True):
            for choice in chunk.choices:
                assert not choice.delta.content
                for piece in choice.delta.tool_calls or []:
                    assert piece.index == 0
                    if piece.function and piece.function.name:
                        names.append(piece.function.name)
                    if piece.function and piece.function.arguments:
                        arguments.append(piece.function.arguments)
                reasons.append(choice.finish_reason)
        assert names == [want_call.function.name]
        assert json.loads("".join(arguments)) == json.loads(want_call.function.arguments)
        assert reasons[-1] == "tool_calls"
