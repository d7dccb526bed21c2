"""`POST /v1/responses`: OpenAI's Responses API, run as the chat completion it amounts to
(`ops.gateway.responses`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from messages.openai_responses import RESPONSES_URL
from ops.gateway.responses import create_response
from ops.gateway.routes.deps import KEYED, PartsDep

router = APIRouter(dependencies=KEYED)


@router.post(RESPONSES_URL)
async def responses(request: Request, parts: PartsDep) -> Response:
    return await create_response(request, parts)
