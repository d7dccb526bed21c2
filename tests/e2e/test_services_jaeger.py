"""The Jaeger the project builds and starts: it takes OTLP and answers its query API.

A span goes in as OTLP/HTTP JSON, the way any OpenTelemetry exporter sends it, and comes back
out of `/api/traces/{id}` and `/api/services`, the API `tokenmill trace` and the UI read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ops.services.jaeger import LocalJaeger
from tests.e2e.otlp import Span, send

REPO = Path(__file__).resolve().parents[2]


def query(jaeger: LocalJaeger, path: str) -> Any:
    with urllib.request.urlopen(f"{jaeger.ui_url}{path}", timeout=10) as reply:
        return json.loads(reply.read())


def test_a_span_sent_over_otlp_is_found_through_the_query_api(jaeger: LocalJaeger) -> None:
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    probe = Span(trace_id, span_id, "probe", attributes={"tokenmill.probe": True})
    assert send(jaeger, "tokenmill-e2e-probe", [probe]) == 200

    deadline = time.monotonic() + 30
    while True:  # the collector batches for up to 200 ms before storing
        try:
            found = query(jaeger, f"/api/traces/{trace_id}")["data"]
            break
        except urllib.error.HTTPError as exc:
            assert exc.code == 404 and time.monotonic() < deadline, exc
            time.sleep(0.2)
    (trace,) = found
    (span,) = trace["spans"]
    assert (span["traceID"], span["spanID"], span["operationName"]) == (trace_id, span_id, "probe")
    assert {"key": "tokenmill.probe", "type": "bool", "value": True} in span["tags"]
    assert trace["processes"][span["processID"]]["serviceName"] == "tokenmill-e2e-probe"
    assert "tokenmill-e2e-probe" in query(jaeger, "/api/services")["data"]


def test_tokenmill_up_with_jaeger_and_down(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ops", *args],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    kafka_dir, jaeger_dir = tmp_path / "kafka", tmp_path / "jaeger"
    up = cli(
        "up", "--kafka-port", "0", "--state-dir", str(kafka_dir), "--jaeger",
        "--jaeger-ui-port", "0", "--otlp-grpc-port", "0", "--otlp-http-port", "0",
        "--jaeger-state-dir", str(jaeger_dir),
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert up.stdout.strip().startswith("127.0.0.1:")
        (ui_line,) = [line for line in up.stderr.splitlines() if "UI and query API at" in line]
        ui_url = ui_line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(f"{ui_url}/api/services", timeout=10) as reply:
            assert reply.status == 200
        assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" in up.stderr
    finally:
        down = cli("down", "--state-dir", str(kafka_dir), "--jaeger-state-dir", str(jaeger_dir))
    assert down.returncode == 0, down.stderr
    assert "kafka: stopped" in down.stdout and "jaeger: stopped" in down.stdout
