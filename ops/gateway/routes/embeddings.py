"""`POST /v1/embeddings`: one vector per input, from a model the fleet serves for embeddings."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from messages.openai_batch import EMBEDDINGS_URL
from ops.gateway.routes.deps import KEYED, PartsDep
from ops.gateway.routes.embedding import embed

router = APIRouter(dependencies=KEYED)


@router.post(EMBEDDINGS_URL)
async def embeddings(request: Request, parts: PartsDep) -> Response:
    return await embed(request, parts)
