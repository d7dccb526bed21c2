"""`POST /v1/completions`: a prompt completed (`stream: true`: as Server-Sent Events)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from messages.openai_batch import COMPLETIONS_URL
from ops.gateway.routes.deps import KEYED, PartsDep
from ops.gateway.routes.generating import generate

router = APIRouter(dependencies=KEYED)


@router.post(COMPLETIONS_URL)
async def completions(request: Request, parts: PartsDep) -> Response:
    return await generate(request, COMPLETIONS_URL, parts)
