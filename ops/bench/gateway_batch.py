"""`bench batch --gateway`: the same batch file through the gateway's Batch API.

    measured = await through_gateway(rig, topics, source, lines, max_inflight, timeout_s)

Starts `tokenmill gateway` (`ops.bench.gateway_process`) on the run's broker,
uploads `source` (`POST /v1/files`), creates the batch (`POST /v1/batches`), asks for it
every 0.2 s until it is final, and reads the gateway process's peak RSS (`VmHWM`) and CPU
seconds before stopping it. Requests/s count from the batch's creation to its completion, as
`batch run`'s count from its start to its end: both exclude starting the process; the
gateway's also excludes the upload, whose time is reported apart.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from ops.bench.gateway_process import gateway_process
from ops.bench.rig import Rig, cpu_seconds

_FINAL = ("completed", "failed", "cancelled", "expired")


async def through_gateway(
    r: Rig,
    topics: dict[str, str],
    source: Path,
    lines: int,
    max_inflight: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Run `source` as a gateway batch; what it measured (raises RuntimeError on failure)."""
    flags = {"--batch-max-inflight": max_inflight, "--max-file-bytes": 1 << 40}  # any file
    async with gateway_process(r, topics, flags, timeout_s) as gw:
        pid = gw.proc.pid
        measured = await asyncio.to_thread(_run, gw.port, pid, source, timeout_s)
        measured["peak_rss_mb"] = _peak_rss_mb(pid)  # the gateway's high-water mark, upload too
    batch = measured.pop("batch")
    counts = batch["request_counts"]
    if batch["status"] != "completed" or counts["completed"] != lines:
        raise RuntimeError(f"the gateway's batch ended {batch['status']}: {counts}")
    return {"complete": True, "ok": counts["completed"], **measured,
            "requests_per_s": round(lines / measured["wall_s"], 1)}  # fmt: skip


def _run(port: int, pid: int, source: Path, timeout_s: float) -> dict[str, Any]:
    """Upload, create, and ask until final: the batch, and the times and CPU it took."""
    started = time.perf_counter()
    file_id = _upload(port, source)["id"]
    uploaded = time.perf_counter()
    cpu_before = cpu_seconds(pid)
    batch = _call(port, "POST", "/v1/batches", {
        "input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h",
    })  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while batch["status"] not in _FINAL:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway's batch is {batch['status']} after {timeout_s} s")
        time.sleep(0.2)  # the next look at its progress
        batch = _call(port, "GET", f"/v1/batches/{batch['id']}")
    wall = time.perf_counter() - uploaded
    cpu_after = cpu_seconds(pid)
    cpu = None if cpu_before is None or cpu_after is None else round(cpu_after - cpu_before, 2)
    return {"batch": batch, "upload_s": round(uploaded - started, 2), "wall_s": round(wall, 2),
            "cpu_s": cpu}  # fmt: skip


def _call(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=data, headers={"content-type": "application/json"})
        return _answer(connection, f"{method} {path}")
    finally:
        connection.close()


def _upload(port: int, source: Path) -> Any:
    """`POST /v1/files` as a multipart form, the file streamed from disk."""
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\ncontent-disposition: form-data; name="file"; '
        f'filename="{source.name}"\r\ncontent-type: application/jsonl\r\n\r\n'
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = len(head) + source.stat().st_size + len(tail)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.putrequest("POST", "/v1/files")
        connection.putheader("content-type", f"multipart/form-data; boundary={boundary}")
        connection.putheader("content-length", str(size))
        connection.endheaders()
        connection.send(head)
        with source.open("rb") as f:
            while chunk := f.read(1 << 20):
                connection.send(chunk)
        connection.send(tail)
        return _answer(connection, "POST /v1/files")
    finally:
        connection.close()


def _answer(connection: http.client.HTTPConnection, asked: str) -> Any:
    response = connection.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"{asked}: {response.status} {answer[:500]!r}")
    return json.loads(answer)


def _peak_rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmHWM:\s+(\d+) kB", status)
    return round(int(found[1]) / 1024, 1) if found else None
