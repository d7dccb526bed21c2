"""`tokenmill trace` against the real Jaeger: a request's spans, found by its id, as a tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ops.services.jaeger import LocalJaeger
from tests.e2e.otlp import Span, send

REPO = Path(__file__).resolve().parents[2]


def cli_trace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops", "trace", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def wait_stored(jaeger: LocalJaeger, trace_id: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{jaeger.ui_url}/api/traces/{trace_id}", timeout=5):
                return
        except urllib.error.HTTPError:
            assert time.monotonic() < deadline, "the trace never reached Jaeger's storage"
            time.sleep(0.2)


def a_request_trace(jaeger: LocalJaeger, request_id: str) -> str:
    """The shape a request's trace has: the producer's send, the worker's spans below it."""
    trace_id = os.urandom(16).hex()
    sent, process, prefill, decode, reply = (os.urandom(8).hex() for _ in range(5))
    producer = Span(trace_id, sent, "send tokenmill.requests", kind=4, start_ms_ago=50)
    producer.attributes = {"messaging.destination.name": "tokenmill.requests"}
    worker = [
        Span(trace_id, process, "process tokenmill.requests", sent, 5, 45, 40,
             {"tokenmill.request_id": request_id, "messaging.kafka.offset": 17}),
        Span(trace_id, prefill, "prefill", process, 1, 40, 5, {"gen_ai.usage.input_tokens": 37}),
        Span(trace_id, decode, "decode", process, 1, 30, 20, {"gen_ai.usage.output_tokens": 8}),
        Span(trace_id, reply, "send tokenmill.results", process, 4, 8, 1,
             {"error.type": "prompt_too_long"}),
    ]  # fmt: skip
    assert send(jaeger, "tokenmill-cli", [producer]) == 200
    assert send(jaeger, "tokenmill", worker) == 200
    wait_stored(jaeger, trace_id)
    return trace_id


def test_a_request_is_found_by_its_id_and_printed_as_a_tree(jaeger: LocalJaeger) -> None:
    request_id = f"job-{os.urandom(4).hex()}"
    trace_id = a_request_trace(jaeger, request_id)
    for key in (request_id, trace_id):
        done = cli_trace(key, "--jaeger", jaeger.ui_url)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == f"trace {trace_id}  (5 spans)"
        assert lines[1].startswith("  send tokenmill.requests  [tokenmill-cli]")
        assert lines[2].startswith("    process tokenmill.requests  [tokenmill]")
        assert "messaging.kafka.offset=17" in lines[2]
        assert f"tokenmill.request_id={request_id}" in lines[2]
        assert [line.split("  [")[0].strip() for line in lines[3:]] == [
            "prefill", "decode", "send tokenmill.results",
        ]  # fmt: skip
        assert all(line.startswith("      ") for line in lines[3:])
        assert "error.type=prompt_too_long" in lines[5]


def test_an_unknown_request_is_a_clear_error(jaeger: LocalJaeger) -> None:
    done = cli_trace("no-such-request", "--jaeger", jaeger.ui_url)
    assert done.returncode == 1
    assert "no trace of 'no-such-request'" in done.stderr


def test_no_jaeger_is_a_clear_error() -> None:
    done = cli_trace("job-1", "--jaeger", "http://127.0.0.1:1")
    assert done.returncode == 1
    assert "cannot reach Jaeger" in done.stderr and "tokenmill up --jaeger" in done.stderr
