"""What the routes are given: the gateway's parts (`Parts`, held on `app.state.parts`) and the
dependencies that read them, the API key check among them.

    @router.get("/v1/models")
    async def models(fleet: FleetDep) -> ...

A router that asks for keys declares it once, `APIRouter(dependencies=[Depends(require_key)])`;
its routes never check a key themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from ops.gateway.batch_runner import BatchRunner
from ops.gateway.errors import unauthorized
from ops.gateway.files import FileStore
from ops.gateway.fleet import FleetWatch
from ops.gateway.keys import KeyCheck
from ops.gateway.metrics import GatewayMetrics
from ops.gateway.service import Gateway
from ops.gateway.tokenizers import LocalTokenizers


@dataclass(frozen=True)
class Parts:
    """One gateway's parts, shared by its routes. `fleet` None: no events topic read (every
    model is taken as served); `batches` None: no /v1/files nor /v1/batches."""

    gateway: Gateway
    keys: KeyCheck
    metrics: GatewayMetrics
    fleet: FleetWatch | None = None
    batches: BatchRunner | None = None
    tokenizers: LocalTokenizers = field(default_factory=LocalTokenizers)


def parts(request: Request) -> Parts:
    found: Parts = request.app.state.parts
    return found


def require_key(request: Request, held: Annotated[Parts, Depends(parts)]) -> None:
    """401 unless the request's `Authorization` carries one of the keys (none: all pass)."""
    if not held.keys.allows(request.headers.get("authorization")):
        raise unauthorized()


def batch_runner(held: Annotated[Parts, Depends(parts)]) -> BatchRunner:
    assert held.batches is not None, "the batch routes are mounted only with a runner"
    return held.batches


def file_store(runner: Annotated[BatchRunner, Depends(batch_runner)]) -> FileStore:
    return runner.files


PartsDep = Annotated[Parts, Depends(parts)]
RunnerDep = Annotated[BatchRunner, Depends(batch_runner)]
FilesDep = Annotated[FileStore, Depends(file_store)]
KEYED = [Depends(require_key)]  # a router's `dependencies=`: every route asks for a key
