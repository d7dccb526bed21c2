"""OpenAI's Files and Batches API on the gateway: the routes over `FileStore` and `BatchRunner`.

    POST   /v1/files                  multipart: file (JSONL), purpose "batch"
    GET    /v1/files, /v1/files/{id}, /v1/files/{id}/content;  DELETE /v1/files/{id}
    POST   /v1/batches                {input_file_id, endpoint, completion_window, metadata}
    GET    /v1/batches, /v1/batches/{id};  POST /v1/batches/{id}/cancel

Uploads are bounded by `--max-file-bytes` (413 past it; 411 without a Content-Length) and
spooled to disk by the form parser, then copied into the store line by line: memory stays
bounded whatever the file's size. Downloads stream from disk.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile

from ops.gateway.batch_runner import BatchRunner
from ops.gateway.batches import BatchRecord
from ops.gateway.bodies import read_body
from ops.gateway.errors import ApiError, not_found, unauthorized
from ops.gateway.files import FileStore
from ops.gateway.keys import KeyCheck

_MAX_BATCH_BODY = 65536  # a batch is asked for in a few hundred bytes
_MAX_LIST = 100  # OpenAI's largest `limit`
_MAX_METADATA = 16  # OpenAI's: keys up to 64 characters, values up to 512


class _NewBatch(msgspec.Struct, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


def batch_router(
    runner: BatchRunner, files: FileStore, keys: KeyCheck, max_file_bytes: int
) -> APIRouter:
    router = APIRouter()

    def check_key(request: Request) -> None:
        if not keys.allows(request.headers.get("authorization")):
            raise unauthorized()

    @router.post("/v1/files")
    async def upload(request: Request) -> dict[str, Any]:
        check_key(request)
        declared = request.headers.get("content-length")
        if declared is None or not declared.isdigit():
            raise ApiError(411, "send the upload with a Content-Length", code="length_required")
        if int(declared) > max_file_bytes:
            raise ApiError(
                413, f"the upload is over {max_file_bytes} bytes", code="request_too_large"
            )
        form = await request.form(max_files=1, max_fields=8)
        try:
            upload, purpose = form.get("file"), form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise ApiError(400, "no `file` in the form", code="invalid_file", param="file")
            if not isinstance(purpose, str):
                raise ApiError(400, "no `purpose` in the form", code="invalid_purpose",
                               param="purpose")  # fmt: skip
            name = upload.filename or "upload.jsonl"
            stored = await asyncio.to_thread(files.save_upload, upload.file, name, purpose)
        finally:
            await form.close()
        return stored.public()

    @router.get("/v1/files")
    async def list_files(request: Request) -> dict[str, Any]:
        check_key(request)
        listed = await asyncio.to_thread(files.listed)
        return {"object": "list", "data": [f.public() for f in listed], "has_more": False}

    @router.get("/v1/files/{file_id}")
    async def get_file(request: Request, file_id: str) -> dict[str, Any]:
        check_key(request)
        stored = files.get(file_id)
        if stored is None:
            raise not_found("file", file_id)
        return stored.public()

    @router.get("/v1/files/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> FileResponse:
        check_key(request)
        stored = files.get(file_id)
        if stored is None:
            raise not_found("file", file_id)
        return FileResponse(files.path(file_id), media_type="application/octet-stream",
                            filename=stored.filename)  # fmt: skip

    @router.delete("/v1/files/{file_id}")
    async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
        check_key(request)
        listed = await asyncio.to_thread(runner.store.listed)
        users = [b.id for b in listed if b.input_file_id == file_id and not b.final]
        if users:
            raise ApiError(400, f"file {file_id} is the input of running batch {users[0]}",
                           code="file_in_use", param="file_id")  # fmt: skip
        if not files.delete(file_id):
            raise not_found("file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @router.post("/v1/batches")
    async def create_batch(request: Request) -> dict[str, Any]:
        check_key(request)
        body = await read_body(request, _MAX_BATCH_BODY)
        try:
            asked = msgspec.json.decode(body, type=_NewBatch)
        except msgspec.ValidationError as exc:
            raise ApiError(400, f"invalid batch: {exc}", code="invalid_request") from None
        except msgspec.DecodeError as exc:
            raise ApiError(400, f"the body is not JSON: {exc}", code="invalid_json") from None
        _check_metadata(asked.metadata)
        record = runner.create(
            asked.input_file_id, asked.endpoint, asked.completion_window, asked.metadata
        )
        return record.public()

    @router.get("/v1/batches")
    async def list_batches(
        request: Request, after: str | None = None, limit: int = 20
    ) -> dict[str, Any]:
        check_key(request)
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
    async def get_batch(request: Request, batch_id: str) -> dict[str, Any]:
        check_key(request)
        record = runner.get(batch_id)
        if record is None:
            raise not_found("batch", batch_id)
        return record.public()

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> dict[str, Any]:
        check_key(request)
        return runner.cancel(batch_id).public()

    return router


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > _MAX_METADATA or any(
        len(k) > 64 or len(v) > 512 for k, v in metadata.items()
    ):
        raise ApiError(
            400,
            f"metadata: at most {_MAX_METADATA} pairs, keys up to 64 characters, values up to 512",
            code="invalid_metadata",
            param="metadata",
        )
