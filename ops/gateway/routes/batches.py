"""OpenAI's Batches API over `BatchRunner`.

POST /v1/batches                {input_file_id, endpoint, completion_window, metadata}
GET  /v1/batches, /v1/batches/{id};  POST /v1/batches/{id}/cancel
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from fastapi import APIRouter, Request

from ops.gateway.batches import BatchRecord
from ops.gateway.bodies import read_body
from ops.gateway.errors import ApiError, not_found
from ops.gateway.routes.deps import KEYED, RunnerDep

router = APIRouter(dependencies=KEYED)

_MAX_BATCH_BODY = 65536  # a batch is asked for in a few hundred bytes
_MAX_LIST = 100  # OpenAI's largest `limit`
_MAX_METADATA = 16  # OpenAI's: keys up to 64 characters, values up to 512


class _NewBatch(msgspec.Struct, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


@router.post("/v1/batches")
async def create_batch(request: Request, runner: RunnerDep) -> dict[str, Any]:
    asked = _new_batch(await read_body(request, _MAX_BATCH_BODY))
    record = runner.create(
        asked.input_file_id, asked.endpoint, asked.completion_window, asked.metadata
    )
    return record.public()


@router.get("/v1/batches")
async def list_batches(
    runner: RunnerDep, after: str | None = None, limit: int = 20
) -> dict[str, Any]:
    listed: list[BatchRecord] = await asyncio.to_thread(runner.store.listed)
    if after is not None:
        ids = [b.id for b in listed]
        listed = listed[ids.index(after) + 1 :] if after in ids else []
    page = listed[: max(1, min(limit, _MAX_LIST))]
    shown = [(runner.get(b.id) or b).public() for b in page]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(listed) > len(page),
    }


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, runner: RunnerDep) -> dict[str, Any]:
    record = runner.get(batch_id)
    if record is None:
        raise not_found("batch", batch_id)
    return record.public()


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, runner: RunnerDep) -> dict[str, Any]:
    return runner.cancel(batch_id).public()


def _new_batch(body: bytes) -> _NewBatch:
    try:
        asked = msgspec.json.decode(body, type=_NewBatch)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid batch: {exc}", code="invalid_request") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}", code="invalid_json") from None
    metadata = asked.metadata or {}
    if len(metadata) > _MAX_METADATA or any(
        len(k) > 64 or len(v) > 512 for k, v in metadata.items()
    ):
        raise ApiError(
            400,
            f"metadata: at most {_MAX_METADATA} pairs, keys up to 64 characters, values up to 512",
            code="invalid_metadata",
            param="metadata",
        )
    return asked
