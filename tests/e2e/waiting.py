"""Waiting for what a test expects to show up in Jaeger (never for a fixed time)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ops.trace.query import JaegerQueryError


async def wait_for(find: Any, within_s: float = 60.0) -> Any:
    """`find()` (run off the loop) once it returns something; the deadline only bounds a hang."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            found = await asyncio.to_thread(find)
        except JaegerQueryError:
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, "the trace never showed up in Jaeger"
        await asyncio.sleep(0.5)
