"""`GET /v1/models`, `GET /v1/models/{id}`: the models the live workers serve
(`ops.gateway.fleet`), each card with its `max_model_len` and its `task` ("embed": an
embedding model, for `/v1/embeddings`; "generate": for completions, chat and responses) as its
workers announce them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ops.gateway.errors import model_not_found
from ops.gateway.fleet import ServedModel
from ops.gateway.routes.deps import KEYED, PartsDep

router = APIRouter(dependencies=KEYED)


@router.get("/v1/models")
async def models(parts: PartsDep) -> dict[str, Any]:
    served = parts.fleet.fleet.models() if parts.fleet is not None else []
    return {"object": "list", "data": [card(m) for m in served]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, parts: PartsDep) -> dict[str, Any]:
    found = parts.fleet.fleet.find(model_id) if parts.fleet is not None else None
    if found is None:
        raise model_not_found(model_id)
    return card(found)


def card(served: ServedModel) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's `max_model_len` (null: no worker said) and
    tokenmill's `task`."""
    return {
        "id": served.name,
        "object": "model",
        "created": served.since,
        "owned_by": "tokenmill",
        "max_model_len": served.max_model_len,
        "task": served.task,
    }
