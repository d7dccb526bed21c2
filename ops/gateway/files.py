"""The gateway's files (`/v1/files`): batch input uploads and the batches' output files, on disk.

    files = FileStore(batch_dir / "files")
    stored = files.save_upload(source, "in.jsonl", "batch")   # validated line by line
    files.get(stored.id), files.path(stored.id), files.listed(), files.delete(id)

Each file is two entries in the folder: `<id>.jsonl`, its bytes, and `<id>.json`, its record
(OpenAI's File object and what the gateway learnt reading it). A record is written after its
bytes, each by an atomic rename, so a file listed is always whole. An upload is read once, a
line at a time, as `tokenmill batch run` reads an input file (`parse_line`): a line that is
not a batch request (not JSON, no `custom_id`, a method or url not served, a body that is not
an object) or a `custom_id` seen before refuses the upload with the lines at fault (400), so a
batch never starts on a file it cannot run. Memory stays bounded whatever the size.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from messages.errors import BatchLineRefused
from messages.openai_batch_mapping import LineCode, parse_line
from ops.batch.ids import Fingerprints
from ops.gateway.batches import write_atomically
from ops.gateway.errors import ApiError

UPLOAD_PURPOSES = ("batch",)  # what clients may upload; the gateway writes "batch_output"
_SHOWN_ERRORS = 10  # line errors named in a refusal
MAX_LINE_BYTES = 16 << 20  # one request line; memory for the check stays within this
_ID = re.compile(r"file-[A-Za-z0-9_-]{1,64}")


class StoredFile(msgspec.Struct, kw_only=True):
    """OpenAI's File object (`public`), and the lines and urls of a batch input."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    lines: int = 0  # non-blank lines
    urls: list[str] = []  # the `url`s its lines ask for

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",  # OpenAI's (deprecated) field, which the SDKs still read
            "status_details": None,
        }


_decoder = msgspec.json.Decoder(StoredFile)


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        return self.root / f"{_safe(file_id)}.jsonl"

    def get(self, file_id: str) -> StoredFile | None:
        try:
            return _decoder.decode((self.root / f"{_safe(file_id)}.json").read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def listed(self) -> list[StoredFile]:
        """Every file, newest first."""
        found = (self.get(p.stem) for p in self.root.glob("file-*.json"))
        return sorted((f for f in found if f is not None), key=lambda f: (-f.created_at, f.id))

    def delete(self, file_id: str) -> bool:
        record = self.root / f"{_safe(file_id)}.json"
        if not record.exists():
            return False
        record.unlink(missing_ok=True)  # first: a file half deleted is not listed
        self.path(file_id).unlink(missing_ok=True)
        return True

    def save_upload(self, source: IO[bytes], filename: str, purpose: str) -> StoredFile:
        """Copy `source` in, validating each line; `ApiError` 400 when a line is at fault."""
        if purpose not in UPLOAD_PURPOSES:
            raise ApiError(
                400,
                f"purpose {purpose!r}: this gateway takes files for {', '.join(UPLOAD_PURPOSES)}",
                code="invalid_purpose",
                param="purpose",
            )
        file_id = new_file_id()
        partial = self.root / f"{file_id}.jsonl.part"
        try:
            with partial.open("wb") as out:
                lines, urls = _copy_checked(source, out)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return self.adopt(file_id, partial, filename, purpose, lines=lines, urls=sorted(urls))

    def adopt(
        self,
        file_id: str,
        source: Path,
        filename: str,
        purpose: str,
        *,
        lines: int = 0,
        urls: list[str] | None = None,
    ) -> StoredFile:
        """Take `source` (moved in) as file `file_id`; a file of that id is replaced."""
        target = self.path(file_id)
        os.replace(source, target)
        stored = StoredFile(
            id=file_id,
            bytes=target.stat().st_size,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
            lines=lines,
            urls=urls or [],
        )
        self._write_record(stored)
        return stored

    def _write_record(self, stored: StoredFile) -> None:
        write_atomically(self.root / f"{stored.id}.json", msgspec.json.encode(stored))


def _copy_checked(source: IO[bytes], out: IO[bytes]) -> tuple[int, set[str]]:
    """Copy line by line; the count of non-blank lines and their urls, or `ApiError` 400."""
    seen = Fingerprints()
    urls: set[str] = set()
    errors: list[str] = []
    faults = lines = 0
    for number, raw in _numbered(source):
        out.write(raw)
        if not raw.strip():
            continue
        lines += 1
        try:
            line = parse_line(raw)
        except BatchLineRefused as exc:
            faults += 1
            if len(errors) < _SHOWN_ERRORS:
                errors.append(f"line {number}: {exc.code}: {exc.message}")
            continue
        urls.add(line.url)
        if not seen.add(line.custom_id):
            faults += 1
            if len(errors) < _SHOWN_ERRORS:
                errors.append(f"line {number}: {LineCode.DUPLICATE_CUSTOM_ID}: {line.custom_id!r}")
    if faults:
        more = f" (and {faults - len(errors)} more)" if faults > len(errors) else ""
        raise ApiError(
            400,
            f"{faults} lines are not batch requests: {'; '.join(errors)}{more}",
            code="invalid_file",
            param="file",
        )
    if not lines:
        raise ApiError(400, "the file holds no request", code="invalid_file", param="file")
    return lines, urls


def _numbered(source: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Each line with its newline, read no further than `MAX_LINE_BYTES` (past it: 400)."""
    number = 0
    while raw := source.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise ApiError(
                400,
                f"line {number} is over {MAX_LINE_BYTES} bytes (far past what Kafka carries)",
                code="invalid_file",
                param="file",
            )
        yield number, raw if raw.endswith(b"\n") else raw + b"\n"


def _safe(file_id: str) -> str:
    """`file_id` as a name in the folder: never a path out of it (an id of other characters
    names no file)."""
    return file_id if _ID.fullmatch(file_id) else "file-invalid"
