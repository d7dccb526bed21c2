"""`GET /v1/models`: the models the live workers serve (`ops.gateway.fleet`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ops.gateway.routes.deps import KEYED, PartsDep

router = APIRouter(dependencies=KEYED)


@router.get("/v1/models")
async def models(parts: PartsDep) -> dict[str, Any]:
    served = parts.fleet.fleet.models() if parts.fleet is not None else []
    data = [
        {"id": m.name, "object": "model", "created": m.since, "owned_by": "tokenmill"}
        for m in served
    ]
    return {"object": "list", "data": data}
