"""The health/readiness/metrics HTTP server, on a real socket (port 0), with a real client.

Well-formed requests go through `http.client` in a thread; malformed ones are written raw.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from actors.http_server import METRICS_CONTENT_TYPE, HttpServer

BOUND = 5.0  # seconds: a generous bound on things expected to happen at once

Reply = tuple[int, dict[str, str], bytes]


class Probe:
    """Readiness and metrics callbacks the tests steer."""

    def __init__(self) -> None:
        self.ready = False
        self.fail = False
        self.body = b"# TYPE tokenmill_queue_depth gauge\ntokenmill_queue_depth 3.0\n"

    def readiness(self) -> tuple[bool, dict[str, object]]:
        if self.fail:
            raise RuntimeError("readiness broke")
        return self.ready, {"consuming": self.ready, "model_loaded": True, "draining": False}

    def metrics(self) -> bytes:
        if self.fail:
            raise RuntimeError("metrics broke")
        return self.body


def make_server(probe: Probe, port: int = 0, timeout_s: float = 5.0) -> HttpServer:
    return HttpServer("127.0.0.1", port, probe.readiness, probe.metrics, timeout_s=timeout_s)


@contextlib.asynccontextmanager
async def serving(server: HttpServer) -> AsyncIterator[HttpServer]:
    """Runs the server until the block ends; raises what run() raised if it never listened."""
    task = asyncio.create_task(server.run())
    listening = asyncio.create_task(server.listening.wait())
    await asyncio.wait({task, listening}, timeout=BOUND, return_when=asyncio.FIRST_COMPLETED)
    listening.cancel()
    if task.done():
        task.result()
    assert server.listening.is_set()
    try:
        yield server
    finally:
        server.stop()
        await asyncio.wait_for(task, BOUND)


def _fetch(port: int, method: str, path: str) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=BOUND)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


async def fetch(server: HttpServer, path: str, method: str = "GET") -> Reply:
    return await asyncio.to_thread(_fetch, server.port, method, path)


async def raw(server: HttpServer, data: bytes) -> bytes:
    """Writes `data` and ends the request stream; returns all the server sends before it closes.

    Ending the stream lets a head cut short end at once instead of waiting out the timeout.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), BOUND)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def status_of(reply: bytes) -> int:
    version, code, _ = reply.split(b"\r\n", 1)[0].split(b" ", 2)
    assert version == b"HTTP/1.1"
    return int(code)


async def test_healthz_answers_ok_and_closes_the_connection() -> None:
    async with serving(make_server(Probe())) as server:
        assert server.port != 0
        status, headers, body = await fetch(server, "/healthz")
        assert status == 200
        assert json.loads(body) == {"status": "ok"}
        assert headers["Content-Type"] == "application/json"
        assert headers["Connection"] == "close"
        assert int(headers["Content-Length"]) == len(body)


async def test_healthz_is_503_with_the_reason_once_not_live() -> None:
    live: list[tuple[bool, dict[str, object]]] = [(True, {"status": "ok"})]
    server = HttpServer("127.0.0.1", 0, Probe().readiness, Probe().metrics, live=lambda: live[-1])
    async with serving(server):
        assert (await fetch(server, "/healthz"))[0] == 200
        live.append((False, {"status": "stalled", "reason": "engine step running for 9 s"}))
        status, headers, body = await fetch(server, "/healthz")
        assert status == 503 and headers["Content-Type"] == "application/json"
        assert json.loads(body) == {"status": "stalled", "reason": "engine step running for 9 s"}


async def test_readyz_is_503_until_ready_then_200_with_the_details() -> None:
    probe = Probe()
    async with serving(make_server(probe)) as server:
        status, _, body = await fetch(server, "/readyz")
        assert status == 503
        assert json.loads(body) == {"consuming": False, "model_loaded": True, "draining": False}
        probe.ready = True
        status, _, body = await fetch(server, "/readyz")
        assert status == 200
        assert json.loads(body)["consuming"] is True


async def test_metrics_serves_the_callbacks_body_as_prometheus_text() -> None:
    probe = Probe()
    async with serving(make_server(probe)) as server:
        status, headers, body = await fetch(server, "/metrics")
        assert status == 200
        assert headers["Content-Type"] == METRICS_CONTENT_TYPE
        assert METRICS_CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
        assert body == probe.body
        status, _, body = await fetch(server, "/metrics?name[]=tokenmill_queue_depth")
        assert (status, body) == (200, probe.body)


async def test_head_gets_the_headers_without_the_body() -> None:
    probe = Probe()
    async with serving(make_server(probe)) as server:
        status, headers, body = await fetch(server, "/metrics", method="HEAD")
        assert (status, body) == (200, b"")
        assert int(headers["Content-Length"]) == len(probe.body)
        reply = await raw(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(reply) == 200
        assert reply.endswith(b"\r\n\r\n")


async def test_unknown_paths_are_404_and_other_methods_405() -> None:
    async with serving(make_server(Probe())) as server:
        status, _, _ = await fetch(server, "/")
        assert status == 404
        status, _, _ = await fetch(server, "/metrics/extra")
        assert status == 404
        status, headers, _ = await fetch(server, "/metrics", method="POST")
        assert status == 405
        assert headers["Allow"] == "GET, HEAD"
        status, _, _ = await fetch(server, "/readyz", method="DELETE")
        assert status == 405


@pytest.mark.parametrize(
    "garbage",
    [
        b"garbage\r\n\r\n",
        b"GET /healthz\r\n\r\n",
        b"GET /healthz HTTP/2.0\r\n\r\n",
        b"get /healthz HTTP/1.1\r\n\r\n",
        b"GET healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /h\xc3\xa9althz HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello, roughly
        b"GET /healthz HTTP/1.1\r\nHost: x",  # cut off before the blank line
    ],
)
async def test_malformed_requests_get_400_and_the_server_keeps_serving(garbage: bytes) -> None:
    async with serving(make_server(Probe())) as server:
        assert status_of(await raw(server, garbage)) == 400
        status, _, _ = await fetch(server, "/healthz")
        assert status == 200


async def test_an_oversized_head_is_refused() -> None:
    async with serving(make_server(Probe())) as server:
        reply = await raw(server, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        assert status_of(reply) == 431
        status, _, _ = await fetch(server, "/healthz")
        assert status == 200


async def test_a_client_that_sends_nothing_in_time_gets_408() -> None:
    async with serving(make_server(Probe(), timeout_s=0.05)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # and never the blank line
        reply = await asyncio.wait_for(reader.read(), BOUND)
        writer.close()
        await writer.wait_closed()
        assert status_of(reply) == 408


async def test_a_connection_closed_without_a_request_is_ignored() -> None:
    async with serving(make_server(Probe())) as server:
        assert await raw(server, b"") == b""  # EOF at once: nothing to answer
        status, _, _ = await fetch(server, "/healthz")
        assert status == 200


async def test_a_raising_callback_gives_500_is_logged_and_serving_goes_on() -> None:
    probe = Probe()
    async with serving(make_server(probe)) as server:
        probe.fail = True
        with capture_logs() as logs:
            assert (await fetch(server, "/readyz"))[0] == 500
            assert (await fetch(server, "/metrics"))[0] == 500
            assert (await fetch(server, "/healthz"))[0] == 200  # liveness needs no callback
        failures = [e for e in logs if e["event"] == "http_callback_failed"]
        assert [e["path"] for e in failures] == ["/readyz", "/metrics"]
        assert all(e["log_level"] == "error" and e["exc_info"] for e in failures)
        probe.fail = False
        assert (await fetch(server, "/metrics"))[0] == 200


async def test_stop_returns_and_run_serves_again_after_it() -> None:
    server = make_server(Probe())
    async with serving(server):
        first = server.port
        assert (await fetch(server, "/healthz"))[0] == 200
    assert not server.listening.is_set()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.to_thread(_fetch, first, "GET", "/healthz")
    async with serving(server):
        assert server.listening.is_set()
        assert (await fetch(server, "/healthz"))[0] == 200


async def test_stop_does_not_wait_for_a_stalled_client() -> None:
    server = make_server(Probe())  # the 5 s read timeout
    reader, writer = None, None
    async with serving(server):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        await writer.drain()
        # Accepted in order: once a later request is answered, the stalled one was taken.
        assert (await fetch(server, "/healthz"))[0] == 200
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
    assert loop.time() - stopped_at < 1.0  # the connection was ended, not waited out
    assert await asyncio.wait_for(reader.read(), BOUND) == b""
    writer.close()
    await writer.wait_closed()


async def test_a_port_in_use_raises_oserror_and_run_works_once_it_is_free() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    server = make_server(Probe(), port=port)
    try:
        with pytest.raises(OSError, match=rf"cannot serve HTTP on 127\.0\.0\.1:{port}: "):
            await asyncio.wait_for(server.run(), BOUND)
        assert not server.listening.is_set()
    finally:
        taken.close()
    async with serving(server):
        assert server.port == port
        assert (await fetch(server, "/healthz"))[0] == 200
