"""The gateway's Batch API (`/v1/files`, `/v1/batches`) with the official `openai` SDK, before a
real SmolLM2 worker on the session broker: answers equal the worker's direct answers, a bad
file is refused, a cancel and an expiry end a batch with every line answered once, and a
gateway killed mid-batch finishes it when it starts again on the same folder."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch

from messages.openai_batch import CHAT_COMPLETIONS_URL
from tests.integration.gateway_fleet import MODEL, Fleet, client, direct_text, gateway
from tests.integration.test_gateway import spawn

pytestmark = pytest.mark.slow

FINAL = ("completed", "failed", "cancelled", "expired")


def chat_line(custom_id: str, question: str, max_tokens: int = 8) -> dict[str, Any]:
    # greedy on purpose: the gateway's Batch API reads an omitted temperature as OpenAI does
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
    return {"custom_id": custom_id, "method": "POST", "url": CHAT_COMPLETIONS_URL, "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


async def wait_until(
    api: openai.AsyncOpenAI, batch_id: str, done: Any, within_s: float = 600
) -> Batch:
    """Retrieve the batch until `done(batch)` holds (the test fails past `within_s`)."""
    deadline = time.monotonic() + within_s
    while not done(batch := await api.batches.retrieve(batch_id)):
        assert time.monotonic() < deadline, batch
        await asyncio.sleep(0.2)  # the next look at the batch's progress
    return batch


async def lines_of(api: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await api.files.content(file_id)
    return [json.loads(line) for line in content.content.splitlines()]


def finish_reason(line: dict[str, Any]) -> str:
    """tokenmill's finish reason (`cancelled` has a field of its own: OpenAI's has none)."""
    choice = line["response"]["body"]["choices"][0]
    return str(choice.get("tokenmill", {}).get("finish_reason", choice["finish_reason"]))


async def test_a_batch_answers_each_line_as_the_worker_does_directly(fleet: Fleet) -> None:
    questions = {f"q{n}": f"Name a color, number {n}." for n in range(4)}
    lines = [chat_line(cid, q) for cid, q in questions.items()]
    lines.append(chat_line("hot", "Too wide?") | {"body": {**lines[0]["body"], "top_p": 2}})
    want = {
        cid: await direct_text(fleet, CHAT_COMPLETIONS_URL, line["body"])
        for cid, line in zip(questions, lines, strict=False)
    }
    async with gateway(fleet) as base, client(base) as api:
        uploaded = await api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        assert (uploaded.purpose, uploaded.filename) == ("batch", "in.jsonl")
        assert (await api.files.retrieve(uploaded.id)).bytes == len(jsonl(lines))
        assert uploaded.id in [f.id for f in (await api.files.list()).data]
        batch = await api.batches.create(
            input_file_id=uploaded.id,
            endpoint=CHAT_COMPLETIONS_URL,
            completion_window="24h",
            metadata={"job": "colors"},
        )
        assert batch.status == "in_progress"
        done = await wait_until(api, batch.id, lambda b: b.status in FINAL)
        assert done.status == "completed", done
        assert done.request_counts is not None
        counts = done.request_counts
        assert (counts.total, counts.completed, counts.failed) == (5, 4, 1)
        assert done.metadata == {"job": "colors"}
        outputs = await lines_of(api, done.output_file_id)
        errors = await lines_of(api, done.error_file_id)
        assert batch.id in [b.id for b in (await api.batches.list()).data]
    got = {
        o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"] for o in outputs
    }
    assert got == want
    [hot] = errors
    assert hot["custom_id"] == "hot" and hot["response"] is None  # never became a request
    assert "top_p" in hot["error"]["message"]


async def test_a_file_with_lines_that_are_not_requests_is_refused(fleet: Fleet) -> None:
    bad = jsonl([chat_line("a", "Hi"), chat_line("a", "Again")]) + b"not json\n"
    async with gateway(fleet) as base, client(base) as api:
        with pytest.raises(openai.BadRequestError) as refused:
            await api.files.create(file=("bad.jsonl", bad), purpose="batch")
        error = refused.value.body
        assert isinstance(error, dict) and error["code"] == "invalid_file"
        assert "line 2: duplicate_custom_id" in error["message"]
        assert "line 3: invalid_json" in error["message"]
        good = await api.files.create(
            file=("in.jsonl", jsonl([chat_line("a", "Hi")])), purpose="batch"
        )
        with pytest.raises(openai.BadRequestError):  # OpenAI's windows are hours
            await api.batches.create(
                input_file_id=good.id, endpoint=CHAT_COMPLETIONS_URL, completion_window="soon"
            )
        mismatched = await api.batches.create(
            input_file_id=good.id, endpoint="/v1/completions", completion_window="24h"
        )
        assert mismatched.status == "failed"
        assert mismatched.errors is not None and mismatched.errors.data is not None
        assert mismatched.errors.data[0].code == "mismatched_endpoint"
        with pytest.raises(openai.NotFoundError):
            await api.batches.retrieve("batch_nosuch")


async def test_a_cancelled_batch_answers_every_line_once(fleet: Fleet) -> None:
    lines = [chat_line(f"c{n}", f"Write a story about the number {n}.", 48) for n in range(24)]
    async with gateway(fleet, batch_max_inflight=2) as base, client(base) as api:
        uploaded = await api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint=CHAT_COMPLETIONS_URL, completion_window="24h"
        )
        await wait_until(api, batch.id, lambda b: b.request_counts.completed >= 1)
        cancelling = await api.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        done = await wait_until(api, batch.id, lambda b: b.status in FINAL)
        outputs = await lines_of(api, done.output_file_id)
        errors = await lines_of(api, done.error_file_id)
    assert done.status == "cancelled", done
    answered = Counter(line["custom_id"] for line in outputs + errors)
    assert set(answered) == {line["custom_id"] for line in lines}
    assert set(answered.values()) == {1}
    assert outputs and all(finish_reason(o) != "cancelled" for o in outputs)  # whole answers
    assert errors and all(e["error"]["code"] == "batch_cancelled" for e in errors)


async def test_a_batch_past_its_window_expires_with_every_line_answered_once(fleet: Fleet) -> None:
    lines = [chat_line(f"e{n}", f"Tell a long tale about {n} cats.", 64) for n in range(24)]
    async with gateway(fleet, batch_max_inflight=1) as base, client(base) as api:
        uploaded = await api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint=CHAT_COMPLETIONS_URL, completion_window="2s"
        )
        done = await wait_until(api, batch.id, lambda b: b.status in FINAL)
        errors = await lines_of(api, done.error_file_id)
        outputs = await lines_of(api, done.output_file_id)
    assert done.status == "expired", done
    assert done.expired_at is not None
    answered = Counter(line["custom_id"] for line in outputs + errors)
    assert sorted(answered) == sorted(line["custom_id"] for line in lines)
    assert set(answered.values()) == {1}
    assert all(finish_reason(o) != "cancelled" for o in outputs)
    assert errors and all(e["error"]["code"] == "batch_expired" for e in errors)


async def test_a_gateway_killed_mid_batch_finishes_it_when_started_again(
    fleet: Fleet, tmp_path: Path
) -> None:
    lines = [chat_line(f"k{n}", f"What is {n} plus {n}?", 24) for n in range(24)]
    want = {
        line["custom_id"]: await direct_text(fleet, CHAT_COMPLETIONS_URL, line["body"])
        for line in lines
    }
    folder = tmp_path / "batches"
    first = GatewayProcess(fleet, folder, tmp_path / "first.log")
    try:
        async with client(await first.start()) as api:
            uploaded = await api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
            batch = await api.batches.create(
                input_file_id=uploaded.id, endpoint=CHAT_COMPLETIONS_URL, completion_window="24h"
            )
            await wait_until(api, batch.id, lambda b: b.request_counts.completed >= 2)
    finally:
        first.kill()  # mid-batch: requests in flight, the output half written
    left = json.loads((folder / "batches" / f"{batch.id}.json").read_text())
    assert left["status"] == "in_progress"  # what the second gateway finds
    second = GatewayProcess(fleet, folder, tmp_path / "second.log")
    try:
        async with client(await second.start()) as api:
            done = await wait_until(api, batch.id, lambda b: b.status in FINAL)
            outputs = await lines_of(api, done.output_file_id)
    finally:
        second.kill()
    assert done.status == "completed", done
    assert Counter(o["custom_id"] for o in outputs) == Counter(want.keys())  # each once
    got = {
        o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"] for o in outputs
    }
    assert got == want


class GatewayProcess:
    """`tokenmill gateway` as a subprocess on `folder`, before the fleet's worker."""

    def __init__(self, fleet: Fleet, folder: Path, log: Path) -> None:
        self.fleet, self.folder, self.log = fleet, folder, log
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> str:
        """Start it; its base URL once it serves."""
        lane = self.fleet.lane
        argv = [
            sys.executable, "-m", "ops", "gateway", "--bootstrap-servers", lane.bootstrap,
            "--port", "0", "--requests-topic", lane.requests, "--cancel-topic", self.fleet.cancel,
            "--events-topic", "", "--batch-dir", str(self.folder), "--batch-max-inflight", "1",
        ]  # fmt: skip
        self.process = spawn(argv, self.log)
        deadline = time.monotonic() + 120
        while not (running := re.search(r"running on http://127.0.0.1:(\d+)", self.text())):
            assert self.process.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            await asyncio.sleep(0.1)  # the gateway is starting
        return f"http://127.0.0.1:{running.group(1)}/v1"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
