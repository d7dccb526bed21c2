"""The routes that ask no key: the gateway's health, readiness, version and metrics.

GET /health    200, empty (a load balancer's probe: the gateway answers)
GET /healthz   200 {"status", "in_flight", "reply_topic"}
GET /readyz    200 while a live worker is listed (the events read), else 503
GET /version   {"version": tokenmill's version}
GET /metrics   Prometheus
"""

from __future__ import annotations

from importlib.metadata import version as package_version
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ops.gateway.routes.deps import PartsDep

router = APIRouter()


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/healthz")
async def healthz(parts: PartsDep) -> dict[str, Any]:
    gateway = parts.gateway
    return {
        "status": "ok",
        "in_flight": gateway.in_flight,
        "reply_topic": gateway.replies.reply_topic,
    }


@router.get("/readyz")
async def readyz(parts: PartsDep) -> JSONResponse:
    """Ready while a request can go to a live worker. Without a fleet watch (no events
    topic) nothing is known, and nothing refused: ready."""
    if parts.fleet is None:
        return JSONResponse({"status": "ready", "models": None})
    models = [m.name for m in parts.fleet.fleet.models()]
    if not parts.fleet.caught_up or not models:
        why = "no live worker is listed" if parts.fleet.caught_up else "the fleet is not read yet"
        return JSONResponse({"status": "not_ready", "reason": why}, status_code=503)
    return JSONResponse({"status": "ready", "models": models})


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": package_version("tokenmill")}


@router.get("/metrics")
async def prometheus(parts: PartsDep) -> Response:
    metrics, gateway = parts.metrics, parts.gateway
    metrics.in_flight.set(gateway.in_flight)
    metrics.dropped.set(gateway.replies.dropped)
    metrics.batches_running.set(parts.batches.running if parts.batches is not None else 0)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
