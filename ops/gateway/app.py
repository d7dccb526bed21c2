"""The gateway's HTTP surface: one router per resource (`ops.gateway.routes`) over the
gateway's parts, wired here.

FastAPI on uvicorn because it is the convention of OpenAI-compatible servers in Python (vLLM,
SGLang, LiteLLM and llama-cpp-python's server all are) and what the project's origin
describes: an asyncio server, so the Kafka clients (aiokafka) share its event loop, with
streaming responses for Server-Sent Events. Bodies are not declared as pydantic models: they
go through the batch mapper (`ops.gateway.bodies`), the one mapping of OpenAI bodies.

The parts live on `app.state.parts` (`routes.deps.Parts`); routes read them through
dependencies, and every router but the utility one asks for a key (`routes.deps.require_key`).
Every error is answered in OpenAI's shape (`errors.error_body`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import structlog
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from ops.gateway.batch_runner import BatchRunner
from ops.gateway.errors import ApiError, error_body
from ops.gateway.fleet import FleetWatch
from ops.gateway.keys import KeyCheck
from ops.gateway.metrics import GatewayMetrics
from ops.gateway.routes import batches as batch_routes
from ops.gateway.routes import (
    chat,
    completions,
    embeddings,
    models,
    responses,
    tokenize,
    utility,
)
from ops.gateway.routes import files as file_routes
from ops.gateway.routes.deps import Parts
from ops.gateway.service import Gateway

log = structlog.get_logger("tokenmill.gateway")


def build_app(
    gateway: Gateway,
    keys: KeyCheck,
    fleet: FleetWatch | None = None,
    batches: BatchRunner | None = None,
) -> FastAPI:
    """The ASGI app; its lifespan starts and stops `gateway.replies`, `fleet` and `batches`
    (None: no /v1/files nor /v1/batches)."""
    parts = Parts(gateway, keys, GatewayMetrics(), fleet, batches)
    app = FastAPI(
        title="tokenmill gateway", lifespan=_lifespan(parts), docs_url=None, redoc_url=None
    )
    app.state.parts = parts
    routers = [completions.router, chat.router, responses.router, embeddings.router]
    routers += [models.router]
    routers += [tokenize.router, utility.router]
    if batches is not None:
        routers += [file_routes.router, batch_routes.router]
    for router in routers:
        app.include_router(router)
    app.state.served = served(routers)
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_parameter)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
    if origins := gateway.settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "x-tokenmill-worker", "retry-after"],
        )
    return app


def _lifespan(parts: Parts) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        replies, fleet, runner = parts.gateway.replies, parts.fleet, parts.batches
        await replies.start()
        if fleet is not None:
            await fleet.start()
        if runner is not None:
            await runner.start()
        log.info("gateway_started", reply_topic=replies.reply_topic, keys=parts.keys.required)
        try:
            yield
        finally:
            await parts.gateway.stop()
            if runner is not None:
                await runner.stop()
            if fleet is not None:
                await fleet.stop()
            await replies.stop()
            log.info("gateway_stopped", dropped=replies.dropped)

    return lifespan


async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _invalid_parameter(_request: Request, exc: RequestValidationError) -> JSONResponse:
    where = ".".join(str(part) for part in exc.errors()[0].get("loc", ())) or None
    body = error_body(400, f"invalid parameter {where}", code="invalid_request", param=where)
    return JSONResponse(body, status_code=400)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Routing's own refusals (no such path, a wrong method) name what was asked and what
    is served; others keep their detail."""
    asked = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        paths = ", ".join(sorted({path for _, path in request.app.state.served}))
        message = f"{asked} is not served by this gateway; served: {paths}"
        body = error_body(404, message, code="unknown_url")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{asked} is not served by this gateway; {request.url.path} takes {allowed}"
        body = error_body(405, message, code="method_not_allowed")
    else:
        body = error_body(exc.status_code, str(exc.detail))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def served(routers: list[APIRouter]) -> list[tuple[str, str]]:
    """Each (method, path) the routers serve."""
    return sorted(
        (method, route.path_format)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    )


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.error("gateway_error", error=repr(exc))  # never a body: it may hold a prompt
    return JSONResponse(
        error_body(500, "internal error in the gateway", code="internal_error"), status_code=500
    )
