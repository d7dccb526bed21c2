"""The gateway's batches (`/v1/batches`) as records on disk: OpenAI's Batch object, one a file.

    store = BatchStore(batch_dir / "batches")
    store.save(record); store.get(batch_id); store.listed()
    store.output(batch_id)      # the run's output, as `tokenmill batch run` writes it
    store.lock(batch_id)        # held by the one instance that runs the batch, or None

A record is rewritten whole by an atomic rename, so a reader (this instance, or another one
sharing the folder) never sees half of one. A record is written first by the instance that
creates the batch, then only by the one holding the batch's lock; a cancel asked of any
instance is a marker file (`cancel_asked`) that the holder acts on.

Statuses, as OpenAI's: `failed` at creation (the input asks for another endpoint) or
`in_progress` → `finalizing` → `completed`; a cancel: `cancelling` → `cancelled`; the
completion window passing: `expired`; the input deleted under a run: `failed`. `validating`
is never stored: the upload was checked. `failed`, `completed`, `cancelled` and `expired`
are final.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
from pathlib import Path
from typing import Any

import msgspec

FINAL = frozenset({"failed", "completed", "cancelled", "expired"})
_ID = re.compile(r"batch_[A-Za-z0-9_-]{1,64}")
_WINDOW = re.compile(r"([1-9][0-9]{0,5})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW_S = 7 * 86400


class RequestCounts(msgspec.Struct):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchRecord(msgspec.Struct, kw_only=True):
    """OpenAI's Batch object (no `model`: the lines name theirs), and the window in seconds."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    window_s: int
    created_at: int
    expires_at: int
    status: str = "validating"
    errors: dict[str, Any] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = msgspec.field(default_factory=RequestCounts)
    usage: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def public(self) -> dict[str, Any]:
        body: dict[str, Any] = msgspec.to_builtins(self)
        del body["window_s"]
        return {"id": body.pop("id"), "object": "batch", **body}


_decoder = msgspec.json.Decoder(BatchRecord)


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def window_seconds(window: str) -> int:
    """`completion_window` ("24h" as OpenAI's; also "90s", "30m", "7d") in seconds, or
    ValueError."""
    matched = _WINDOW.fullmatch(window)
    if matched is None:
        raise ValueError(f"completion_window {window!r}: write it as 24h (or 90s, 30m, 2d)")
    seconds = int(matched[1]) * _UNIT_S[matched[2]]
    if seconds > MAX_WINDOW_S:
        raise ValueError(f"completion_window {window!r} is over 7 days")
    return seconds


class BatchStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, batch_id: str) -> BatchRecord | None:
        try:
            return _decoder.decode((self.root / f"{_safe(batch_id)}.json").read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def listed(self) -> list[BatchRecord]:
        """Every batch, newest first."""
        found = (self.get(p.stem) for p in self.root.glob("batch_*.json"))
        return sorted((b for b in found if b is not None), key=lambda b: (-b.created_at, b.id))

    def save(self, record: BatchRecord) -> None:
        write_atomically(self.root / f"{record.id}.json", msgspec.json.encode(record))

    def output(self, batch_id: str) -> Path:
        """Where the batch's run appends its answers (`ops.batch.output`)."""
        return self.root / f"{_safe(batch_id)}.out.jsonl"

    def cancel_asked(self, batch_id: str) -> Path:
        return self.root / f"{_safe(batch_id)}.cancel-asked"

    def lock(self, batch_id: str) -> int | None:
        """An open descriptor holding the batch's lock (close it to let go), or None when
        another run holds it (here, or in another instance sharing the folder)."""
        fd = os.open(self.root / f"{_safe(batch_id)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd


def _safe(batch_id: str) -> str:
    """`batch_id` as a name in the folder: never a path out of it."""
    return batch_id if _ID.fullmatch(batch_id) else "batch_invalid"


def write_atomically(target: Path, data: bytes) -> None:
    """`data` as `target`, whole or not at all, and on disk (a power loss keeps it): written
    beside it under a name of its own, synced, renamed over it."""
    partial = target.with_name(f"{target.name}.{secrets.token_hex(4)}.part")
    try:
        with partial.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself
    finally:
        os.close(folder)
