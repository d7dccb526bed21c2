"""A `tokenmill gateway` subprocess for the benchmarks, and a light HTTP/1.1 client for it.

    async with gateway_process(rig, topics, {"--max-inflight": 512}, timeout_s) as gw:
        async with http_lanes(gw.port, 32) as lanes:
            status = await lanes[0].post("/v1/completions", body)

The gateway runs as deployed (its CLI), sends to the run's topics and keeps its files and
batches in a folder of the run (never the user's `--batch-dir`); it is stopped with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import h11

from ops.bench.rig import Rig, log_tail, worker_process
from ops.connection.options import connection_argv
from ops.services.local_process import free_port


class HttpLane:
    """One keep-alive HTTP/1.1 connection. h11 (uvicorn's parser, installed with it), not an
    HTTP client library: none is a dependency, and on a 2-core host a lighter client leaves
    more of the CPU to the gateway it measures."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT)
        self.first_data_at: float | None = None  # the last answer's first body bytes came

    async def post(self, path: str, payload: bytes) -> int:
        """POST `payload` (JSON); the answer's status once its body has been read, and when
        its first body bytes came in `first_data_at` (perf_counter; None: no body)."""
        self.first_data_at = None
        head = [("host", "bench"), ("content-type", "application/json"),
                ("content-length", str(len(payload)))]  # fmt: skip
        for event in (h11.Request(method="POST", target=path, headers=head),
                      h11.Data(data=payload), h11.EndOfMessage()):  # fmt: skip
            self.writer.write(self.conn.send(event) or b"")
        status = 0
        while not isinstance(got := self.conn.next_event(), h11.EndOfMessage):
            if got is h11.NEED_DATA:
                self.conn.receive_data(await self.reader.read(1 << 16))
            elif isinstance(got, h11.Response):
                status = got.status_code
            elif isinstance(got, h11.Data) and self.first_data_at is None:
                self.first_data_at = time.perf_counter()
            elif isinstance(got, h11.ConnectionClosed):
                raise ConnectionError("the gateway closed the connection")
        self.conn.start_next_cycle()
        return status


@contextlib.asynccontextmanager
async def http_lanes(port: int, count: int) -> AsyncIterator[list[HttpLane]]:
    """`count` fresh connections. uvicorn closes one idle for 5 s (a direct run is longer),
    so each gateway run opens its own, before it is timed."""
    lanes = [HttpLane(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(count)]
    try:
        yield lanes
    finally:
        for lane in lanes:
            lane.writer.close()


@dataclass
class Gateway:
    proc: asyncio.subprocess.Process
    port: int
    argv: list[str]
    folder: Path  # its --batch-dir


@contextlib.asynccontextmanager
async def gateway_process(
    r: Rig, topics: Mapping[str, str], flags: Mapping[str, object], timeout_s: float
) -> AsyncIterator[Gateway]:
    """`tokenmill gateway` on a free port, sending to `topics` (no events topic: GET /v1/models
    is not measured), with `flags` besides; yields once it listens, which it does only after
    its reply topics exist and the workers have had time to see them."""
    port = free_port()
    log, folder = r.tmp / f"gateway-{port}.log", r.tmp / f"gateway-{port}"
    connection, secrets = connection_argv(r.kafka)
    given: dict[str, object] = {
        "--port": port, "--requests-topic": topics["requests"], "--events-topic": "",
        "--batch-dir": folder,
    }  # fmt: skip
    if "cancel" in topics:
        given["--cancel-topic"] = topics["cancel"]
    given |= flags
    argv = [sys.executable, "-c", "from ops.cli import main; main()", "gateway", *connection]
    argv += [str(x) for pair in given.items() for x in pair]
    async with worker_process(argv, log, env=secrets) as proc:  # SIGTERM: a clean stop
        async with asyncio.timeout(timeout_s):
            while True:  # across processes, no event to wait on: poll until it listens
                if proc.returncode is not None:
                    raise RuntimeError(f"the gateway exited:\n{log_tail(log)}")
                try:
                    _, probe = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    await asyncio.sleep(0.2)
                    continue
                probe.close()
                break
        yield Gateway(proc, port, argv[3:], folder)
