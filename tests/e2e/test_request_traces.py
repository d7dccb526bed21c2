"""One connected trace per request, from `tokenmill submit`'s send to the worker's result send,
in a real Jaeger: real Kafka, a `tokenmill worker` subprocess, `tokenmill submit --wait`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from messages.headers import TRACEPARENT, header
from messages.request import GenerateRequest
from ops.services.jaeger import LocalJaeger
from ops.services.local_process import free_port
from ops.trace.query import trace_by_id, traces_of_request
from ops.trace.tree import SpanNode, TraceTree
from tests.e2e.waiting import wait_for
from tests.integration.pipeline import REPO, Lane, WorkerProcess, new_lane, produce, read_all


def otel_env(jaeger: LocalJaeger) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def submit(lane: Lane, jobs: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "ops", "submit", "--file", str(jobs), "--wait", "--timeout", "120",
        "--topic", lane.requests, "--results-topic", lane.results,
        "--bootstrap-servers", lane.bootstrap,
    ]  # fmt: skip
    return subprocess.run(
        argv, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def batch_of(jaeger: LocalJaeger, trace: dict[str, Any], process: SpanNode) -> Any:
    """The `batch` span the process span links to (it lives in a trace of its own)."""
    (span,) = [s for s in trace["spans"] if s["spanID"] == process.span_id]
    links = [r for r in span["references"] if r["traceID"] != trace["traceID"]]
    if not links:
        return None
    found = trace_by_id(jaeger.ui_url, links[0]["traceID"])
    spans = [s for s in (found or {}).get("spans", []) if s["spanID"] == links[0]["spanID"]]
    return spans[0] if spans else None


def names(nodes: list[SpanNode]) -> list[str]:
    return [node.name for node in nodes]


async def test_each_request_leaves_one_connected_trace(
    kafka_bootstrap: str, jaeger: LocalJaeger, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        '{"id": "traced-1", "prompt_token_ids": [4, 5, 6], "max_new_tokens": 3}\n'
        '{"id": "traced-2", "prompt_token_ids": [7, 8], "max_new_tokens": 2}\n'
        '{"id": "traced-bad", "prompt_token_ids": [4], "max_new_tokens": 0}\n'
    )
    foreign_trace = os.urandom(16).hex()
    foreign = f"00-{foreign_trace}-{os.urandom(8).hex()}-01".encode()
    worker = WorkerProcess(
        lane, str(tiny_checkpoints["llama"]), tmp_path / "worker.log", env=otel_env(jaeger)
    ).start()
    try:
        await worker.wait_for_log("ingest_started")
        done = await asyncio.to_thread(submit, lane, jobs, otel_env(jaeger))
        assert done.returncode == 1, done.stderr[-3000:]  # traced-bad is refused
        foreign_request = GenerateRequest(
            id="traced-foreign", prompt_token_ids=[3], max_new_tokens=1
        )
        await produce(
            lane.bootstrap, lane.requests, [foreign_request], headers=[(TRACEPARENT, foreign)]
        )
        results = await read_all(lane.bootstrap, lane.results, until=4)
        assert worker.terminate() == 0  # drains and flushes its spans
    finally:
        worker.close()

    for request_id in ("traced-1", "traced-2"):
        (found,) = await wait_for(lambda rid=request_id: traces_of_request(jaeger.ui_url, rid))
        tree = TraceTree.of(found)
        (root,) = tree.roots
        assert (root.name, root.service) == (f"send {lane.requests}", "tokenmill-cli")
        (process,) = root.children
        assert (process.name, process.service) == (f"process {lane.requests}", "tokenmill")
        assert process.tags["tokenmill.request_id"] == request_id
        assert process.tags["messaging.system"] == "kafka"
        assert process.tags["messaging.consumer.group.name"] == lane.group
        assert process.tags["gen_ai.usage.output_tokens"] >= 1
        assert process.tags["tokenmill.kv_blocks"] >= 1
        assert process.tags["tokenmill.preemptions"] == 0
        assert names(process.children) == ["queue", "prefill", "decode", f"send {lane.results}"]
        assert not process.error
        batch = await wait_for(lambda span=found, node=process: batch_of(jaeger, span, node))
        assert batch["operationName"] == "batch"
        tags = {tag["key"]: tag["value"] for tag in batch["tags"]}
        assert tags["tokenmill.batch.size"] >= 1 and "tokenmill.bucket" in tags
        assert found["traceID"] in {ref["traceID"] for ref in batch["references"]}

    (bad,) = await wait_for(lambda: traces_of_request(jaeger.ui_url, "traced-bad"))
    (process,) = TraceTree.of(bad).roots[0].children
    assert process.error and process.tags["error.type"] == "invalid_max_tokens"
    assert names(process.children) == [f"send {lane.results}"]

    continued = await wait_for(lambda: trace_by_id(jaeger.ui_url, foreign_trace))
    (process,) = TraceTree.of(continued).roots  # its parent is the foreign producer's span
    assert process.tags["tokenmill.request_id"] == "traced-foreign"

    by_id = {json.loads(r.value)["id"]: r for r in results if r.value}
    result_trace = header(by_id["traced-foreign"].headers, TRACEPARENT)
    assert result_trace is not None
    _, trace_id, span_id, _ = result_trace.decode().split("-")
    assert trace_id == foreign_trace, "the result continues the producer's trace"
    assert span_id != foreign.decode().split("-")[2], "from the worker's send span"


async def test_with_no_collector_every_request_is_still_answered(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    nowhere = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    requests = [
        GenerateRequest(id=f"untraced-{i}", prompt_token_ids=[4, 5], max_new_tokens=2)
        for i in range(40)
    ]
    worker = WorkerProcess(
        lane, str(tiny_checkpoints["llama"]), tmp_path / "worker.log", env=nowhere
    ).start()
    try:
        await worker.wait_for_log("ingest_started")
        await produce(lane.bootstrap, lane.requests, requests)
        results = await read_all(lane.bootstrap, lane.results, until=40)
        assert worker.terminate() == 0  # its last export fails within the exporter's timeout
    finally:
        worker.close()
    answered = {json.loads(r.value)["id"] for r in results if r.value}
    assert answered == {r.id for r in requests}
    assert "Traceback" not in worker.log()
