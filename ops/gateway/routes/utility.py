"""The routes that ask no key: the gateway's own health and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ops.gateway.routes.deps import PartsDep

router = APIRouter()


@router.get("/healthz")
async def healthz(parts: PartsDep) -> dict[str, Any]:
    gateway = parts.gateway
    return {
        "status": "ok",
        "in_flight": gateway.in_flight,
        "reply_topic": gateway.replies.reply_topic,
    }


@router.get("/metrics")
async def prometheus(parts: PartsDep) -> Response:
    metrics, gateway = parts.metrics, parts.gateway
    metrics.in_flight.set(gateway.in_flight)
    metrics.dropped.set(gateway.replies.dropped)
    metrics.batches_running.set(parts.batches.running if parts.batches is not None else 0)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
