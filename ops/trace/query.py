"""Jaeger's query API (the JSON one its UI reads), for `tokenmill trace`.

    traces_of_request("http://127.0.0.1:16686", "job-17")  -> [trace JSON, ...]
    trace_by_id("http://127.0.0.1:16686", "4bf92f3577b34da6a3ce929d0e0e4736") -> trace JSON | None

A request is found by the `tokenmill.request_id` attribute the worker puts on its spans.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ops.errors import JaegerQueryError

REQUEST_ID_ATTRIBUTE = "tokenmill.request_id"
# Jaeger is usually local: never send its queries through an http_proxy from the environment.
_LOOPBACK_OK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def traces_of_request(
    jaeger_url: str, request_id: str, *, service: str = "tokenmill", lookback: str = "24h"
) -> list[dict[str, Any]]:
    """The traces in which `service` tagged a span with this request id, newest first."""
    end_us = int(time.time() * 1e6)
    query = urllib.parse.urlencode(
        {
            "service": service,
            "tags": json.dumps({REQUEST_ID_ATTRIBUTE: request_id}),
            "start": end_us - int(lookback_seconds(lookback) * 1e6),
            "end": end_us,
            "limit": 20,
        }
    )
    found = _get(f"{jaeger_url.rstrip('/')}/api/traces?{query}")
    traces: list[dict[str, Any]] = found.get("data") or []
    return sorted(traces, key=_started, reverse=True)


def lookback_seconds(lookback: str) -> float:
    """ "90s", "30m", "24h", "2d" → seconds; raises ValueError for anything else."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = lookback[:-1], lookback[-1:]
    if unit not in units or not number.replace(".", "", 1).isdigit():
        raise ValueError(f"lookback {lookback!r}: a number and s, m, h or d (e.g. 24h)")
    return float(number) * units[unit]


def trace_by_id(jaeger_url: str, trace_id: str) -> dict[str, Any] | None:
    try:
        found = _get(f"{jaeger_url.rstrip('/')}/api/traces/{trace_id}")
    except JaegerQueryError as exc:
        if exc.status == 404:
            return None
        raise
    data = found.get("data") or []
    return data[0] if data else None


def _started(trace: dict[str, Any]) -> int:
    return min((int(span.get("startTime", 0)) for span in trace.get("spans", [])), default=0)


def _get(url: str) -> dict[str, Any]:
    try:
        with _LOOPBACK_OK.open(url, timeout=10) as reply:
            body: dict[str, Any] = json.loads(reply.read())
            return body
    except urllib.error.HTTPError as exc:
        raise JaegerQueryError(f"{url}: HTTP {exc.code}", status=exc.code) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise JaegerQueryError(
            f"cannot reach Jaeger at {url.split('/api/')[0]} ({exc}); start it with "
            "`tokenmill up --jaeger` or pass --jaeger URL"
        ) from exc
    except ValueError as exc:
        raise JaegerQueryError(f"{url}: not JSON ({exc})") from exc
