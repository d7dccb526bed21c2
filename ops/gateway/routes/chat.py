"""`POST /v1/chat/completions`: a conversation answered (`stream: true`: as Server-Sent Events)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from messages.openai_batch import CHAT_COMPLETIONS_URL
from ops.gateway.routes.deps import KEYED, PartsDep
from ops.gateway.routes.generating import generate

router = APIRouter(dependencies=KEYED)


@router.post(CHAT_COMPLETIONS_URL)
async def chat_completions(request: Request, parts: PartsDep) -> Response:
    return await generate(request, CHAT_COMPLETIONS_URL, parts)
