"""OpenAI's Files API over `FileStore`: the inputs and outputs of batches.

    POST   /v1/files                  multipart: file (JSONL), purpose "batch"
    GET    /v1/files, /v1/files/{id}, /v1/files/{id}/content;  DELETE /v1/files/{id}

Uploads are bounded by `--max-file-bytes` (413 past it; 411 without a Content-Length) and
spooled to disk by the form parser, then copied into the store line by line: memory stays
bounded whatever the file's size. Downloads stream from disk.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile

from ops.gateway.errors import ApiError, not_found
from ops.gateway.files import StoredFile
from ops.gateway.routes.deps import KEYED, FilesDep, PartsDep, RunnerDep

router = APIRouter(dependencies=KEYED)


@router.post("/v1/files")
async def upload(request: Request, files: FilesDep, parts: PartsDep) -> dict[str, Any]:
    limit = parts.gateway.settings.max_file_bytes
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise ApiError(411, "send the upload with a Content-Length", code="length_required")
    if int(declared) > limit:
        raise ApiError(413, f"the upload is over {limit} bytes", code="request_too_large")
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
async def list_files(files: FilesDep) -> dict[str, Any]:
    listed = await asyncio.to_thread(files.listed)
    return {"object": "list", "data": [f.public() for f in listed], "has_more": False}


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, files: FilesDep) -> dict[str, Any]:
    return _stored(files.get(file_id), file_id).public()


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, files: FilesDep) -> FileResponse:
    stored = _stored(files.get(file_id), file_id)
    return FileResponse(files.path(file_id), media_type="application/octet-stream",
                        filename=stored.filename)  # fmt: skip


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, files: FilesDep, runner: RunnerDep) -> dict[str, Any]:
    listed = await asyncio.to_thread(runner.store.listed)
    users = [b.id for b in listed if b.input_file_id == file_id and not b.final]
    if users:
        raise ApiError(400, f"file {file_id} is the input of running batch {users[0]}",
                       code="file_in_use", param="file_id")  # fmt: skip
    if not files.delete(file_id):
        raise not_found("file", file_id)
    return {"id": file_id, "object": "file", "deleted": True}


def _stored(stored: StoredFile | None, file_id: str) -> StoredFile:
    if stored is None:
        raise not_found("file", file_id)
    return stored
