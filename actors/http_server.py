"""A minimal HTTP/1.1 server for `/healthz`, `/readyz` and `/metrics`, on `asyncio.start_server`.

No framework: each connection sends one request head (at most 8 KiB, within 5 s), gets one
answer and is closed (`Connection: close`). GET and HEAD only; a body is never read. What a
client sends can at worst earn it a 400; a callback that raises earns a 500 and a log line; the
server keeps serving either way.

    /healthz  200 {"status":"ok"} while the worker is live; 503 with the reason when not
    /readyz   200, or 503 when not ready, with the readiness details as JSON
    /metrics  200, the Prometheus text format from the `metrics` callback
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

import structlog

__all__ = ["METRICS_CONTENT_TYPE", "HttpServer"]

log = structlog.get_logger("tokenmill.http")

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_CONNECTIONS = 64  # open at once; more are closed at once
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
ALLOWED = ("GET", "HEAD")

Ready = Callable[[], tuple[bool, dict[str, object]]]


class _BadRequest(Exception):
    """The request head cannot be parsed; answered with 400."""


class _Response:
    __slots__ = ("body", "content_type", "extra", "status")

    def __init__(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str = TEXT,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.extra = extra

    def encode(self, *, head_only: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status.value} {self.status.phrase}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Cache-Control: no-store",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.extra),
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def _plain(status: HTTPStatus, **extra: str) -> _Response:
    return _Response(status, f"{status.phrase}\n".encode(), extra=tuple(extra.items()))


def _json(status: HTTPStatus, value: object) -> _Response:
    body = json.dumps(value, separators=(",", ":"), default=str).encode()
    return _Response(status, body, JSON)


def _probe(ok: bool, details: dict[str, object]) -> _Response:
    return _json(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, details)


def _parse_head(head: bytes) -> tuple[str, str]:
    """The method and path of a request head, or `_BadRequest`."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest("the request head is not ASCII") from None
    request_line, *header_lines = text.removesuffix("\r\n\r\n").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise _BadRequest("the request line is not 'METHOD TARGET VERSION'")
    method, target, version = parts
    if not method.isalpha() or not method.isupper():
        raise _BadRequest("the method is not a token")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(f"unsupported version {version[:16]!r}")
    if not target.startswith("/"):
        raise _BadRequest("the target is not an absolute path")
    for line in header_lines:
        name, colon, _ = line.partition(":")
        if not colon or not name or name != name.strip():
            raise _BadRequest("a header line is not 'Name: value'")
    return method, urlsplit(target).path


class HttpServer:
    """Serves health, readiness and metrics until `stop()`; `run()` may be called again after.

    `ready()` returns (ready, details), `live()` (live, details) (default: always live) and
    `metrics()` the exposition body; each is called on the event loop, once per request, so
    they must be quick. `port` is the bound port once
    `listening` is set (the one asked for, or the kernel's pick when that was 0); `listening`
    is cleared whenever `run()` ends, returned or raised. An address that cannot be bound (in
    use, not permitted) raises OSError from `run()` with the original errno: the caller decides.
    A `stop()` before `run()` makes that run return at once.
    """

    def __init__(
        self,
        host: str,
        port: int,
        ready: Ready,
        metrics: Callable[[], bytes],
        *,
        timeout_s: float = 5.0,
        max_head_bytes: int = 8192,
        live: Ready | None = None,
    ) -> None:
        self.name = "http"  # as the supervisor names its children
        self.host = host
        self.port = port
        self.listening = asyncio.Event()
        self._bind_port = port
        self._ready = ready
        self._live = live or (lambda: (True, {"status": "ok"}))
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._max_head_bytes = max_head_bytes
        self._stopping = asyncio.Event()
        self._connections: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Make `run()` close the socket, end open connections and return."""
        self._stopping.set()

    async def run(self) -> None:
        """Listen and serve until `stop()`. Raises OSError when the address cannot be bound."""
        try:
            if self._stopping.is_set():
                return
            try:
                server = await asyncio.start_server(
                    self._connection, self.host, self._bind_port, limit=self._max_head_bytes
                )
            except OSError as e:
                reason = os.strerror(e.errno) if e.errno else str(e)
                where = f"{self.host}:{self._bind_port}"
                raise OSError(e.errno, f"cannot serve HTTP on {where}: {reason}") from e
            async with server:
                self.port = server.sockets[0].getsockname()[1]
                self.listening.set()
                log.info("http_listening", host=self.host, port=self.port)
                try:
                    await self._stopping.wait()
                finally:
                    server.close()
                    await self._end_connections()
        finally:
            self.listening.clear()
            self._stopping.clear()

    async def _end_connections(self) -> None:
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONNECTIONS:  # a flood: keep descriptors for Kafka
            writer.close()
            return
        self._connections.add(task)
        try:
            answer = await self._answer(reader)
            if answer is None:
                return  # connected and closed without a word (a TCP probe)
            response, head_only = answer
            async with asyncio.timeout(self._timeout_s):
                writer.write(response.encode(head_only=head_only))
                await writer.drain()
        except (ConnectionError, TimeoutError):
            pass  # the client went away or stalled; nothing to answer
        except Exception:
            log.exception("http_connection_failed")
        finally:
            writer.close()
            try:
                with contextlib.suppress(ConnectionError, TimeoutError):
                    async with asyncio.timeout(self._timeout_s):
                        await writer.wait_closed()
            finally:
                self._connections.discard(task)  # only now: stop() still ends a slow close

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[_Response, bool] | None:
        """The response to the one request on this connection, and whether it is a HEAD."""
        try:
            async with asyncio.timeout(self._timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path = _parse_head(head)
        except TimeoutError:
            return _plain(HTTPStatus.REQUEST_TIMEOUT), False
        except asyncio.LimitOverrunError:
            return _plain(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE), False
        except asyncio.IncompleteReadError as e:
            return (_plain(HTTPStatus.BAD_REQUEST), False) if e.partial else None
        except _BadRequest as e:
            log.debug("http_bad_request", reason=str(e))
            return _plain(HTTPStatus.BAD_REQUEST), False
        head_only = method == "HEAD"
        if path not in ("/healthz", "/readyz", "/metrics"):
            return _plain(HTTPStatus.NOT_FOUND), head_only
        if method not in ALLOWED:
            return _plain(HTTPStatus.METHOD_NOT_ALLOWED, Allow=", ".join(ALLOWED)), False
        try:
            return self._route(path), head_only
        except Exception:
            log.exception("http_callback_failed", path=path)
            return _plain(HTTPStatus.INTERNAL_SERVER_ERROR), head_only

    def _route(self, path: str) -> _Response:
        match path:
            case "/healthz":
                return _probe(*self._live())
            case "/readyz":
                return _probe(*self._ready())
            case _:
                return _Response(HTTPStatus.OK, self._metrics(), METRICS_CONTENT_TYPE)
