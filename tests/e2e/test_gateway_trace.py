"""One trace from an HTTP call through the gateway to the worker, in a real Jaeger: real Kafka,
`tokenmill gateway` and `tokenmill worker` subprocesses, a caller that sends a `traceparent`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ops.services.jaeger import LocalJaeger
from ops.trace.query import trace_by_id
from ops.trace.tree import SpanNode, TraceTree
from tests.e2e.test_request_traces import otel_env
from tests.e2e.waiting import wait_for
from tests.integration.pipeline import REPO, WorkerProcess, new_lane


def spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=out, env={**os.environ, **env})


def post(url: str, body: dict[str, object], traceparent: str) -> dict[str, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "traceparent": traceparent},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return dict(json.loads(response.read()))


async def test_an_http_call_and_its_worker_spans_are_one_trace(
    kafka_bootstrap: str, jaeger: LocalJaeger, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    env = otel_env(jaeger)
    worker = WorkerProcess(
        lane, str(tiny_checkpoints["llama"]), tmp_path / "worker.log", env=env
    ).start()
    log = tmp_path / "gateway.log"
    argv = [
        sys.executable, "-m", "ops", "gateway", "--bootstrap-servers", kafka_bootstrap,
        "--port", "0", "--requests-topic", lane.requests, "--events-topic", "",
        "--batch-dir", str(tmp_path / "batches"),
    ]  # fmt: skip
    gateway = spawn(argv, log, env)
    caller_trace = os.urandom(16).hex()
    try:
        await worker.wait_for_log("ingest_started")
        deadline = time.monotonic() + 120
        while not (running := re.search(r"running on http://127.0.0.1:(\d+)", log.read_text())):
            assert gateway.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)  # the gateway is starting
        url = f"http://127.0.0.1:{running.group(1)}/v1/completions"
        parent = f"00-{caller_trace}-{os.urandom(8).hex()}-01"
        body = {"prompt": [4, 5, 6], "max_tokens": 3}
        answer = await asyncio.to_thread(post, url, body, parent)
        assert answer["object"] == "text_completion"
        gateway.send_signal(signal.SIGTERM)  # stops cleanly, flushing its spans
        assert await asyncio.to_thread(gateway.wait, 60) == 0
        assert worker.terminate() == 0
    finally:
        if gateway.poll() is None:
            gateway.kill()
        worker.close()

    found = await wait_for(lambda: trace_by_id(jaeger.ui_url, caller_trace))
    (root,) = TraceTree.of(found).roots  # its parent is the caller's span, not in Jaeger
    assert (root.name, root.service) == ("POST /v1/completions", "tokenmill-gateway")
    process, path = find(root, f"process {lane.requests}")
    assert process.service == "tokenmill"
    gateway_span = path[-1]  # the round trip, whose context the record carried
    assert (gateway_span.name, gateway_span.service) == (
        "gateway /v1/completions",
        "tokenmill-gateway",
    )
    assert process.tags["tokenmill.request_id"] == gateway_span.tags["tokenmill.request_id"]


def find(
    node: SpanNode, name: str, path: tuple[SpanNode, ...] = ()
) -> tuple[SpanNode, tuple[SpanNode, ...]]:
    """The span named `name` below `node`, and the spans on the way to it."""
    for child in node.children:
        if child.name == name:
            return child, (*path, node)
        try:
            return find(child, name, (*path, node))
        except LookupError:
            continue
    raise LookupError(name)
