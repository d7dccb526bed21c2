"""`BatchStore` and `finish`: records on disk, one run per batch, and how a batch ends."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from unittest.mock import Mock

import pytest

from messages.openai_batch import BatchOutputLine, BatchResponse
from ops.batch.output import OutputWriter
from ops.gateway.batch_ending import finish
from ops.gateway.batches import BatchRecord, BatchStore, new_batch_id, window_seconds
from ops.gateway.files import FileStore


@pytest.mark.parametrize(
    ("window", "seconds"), [("24h", 86400), ("90s", 90), ("30m", 1800), ("7d", 604800)]
)
def test_windows_are_read_in_seconds(window: str, seconds: int) -> None:
    assert window_seconds(window) == seconds


@pytest.mark.parametrize("window", ["", "24", "0h", "8d", "1.5h", "24 h", "-1h", "soon"])
def test_other_windows_are_refused(window: str) -> None:
    with pytest.raises(ValueError):
        window_seconds(window)


def record(input_file_id: str = "file-x", total: int = 0) -> BatchRecord:
    batch = BatchRecord(
        id=new_batch_id(),
        endpoint="/v1/chat/completions",
        input_file_id=input_file_id,
        completion_window="24h",
        window_s=86400,
        created_at=1_700_000_000,
        expires_at=1_700_086_400,
        status="in_progress",
    )
    batch.request_counts.total = total
    return batch


def test_a_record_is_saved_and_read_back_in_openai_s_shape(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    saved = record()
    store.save(saved)
    assert store.get(saved.id) == saved
    public = saved.public()
    assert public["object"] == "batch" and "window_s" not in public
    assert public["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert [b.id for b in store.listed()] == [saved.id]
    assert store.get("batch_../../x") is None


def test_one_lock_per_batch(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    held = store.lock("batch_a")
    assert held is not None
    assert store.lock("batch_a") is None  # another run (a second descriptor) is refused
    assert store.lock("batch_b") is not None
    os.close(held)
    again = store.lock("batch_a")
    assert again is not None
    os.close(again)


def answered(custom_id: str, status: int = 200, finish_reason: str = "stop") -> BatchOutputLine:
    body = {
        "choices": [{"index": 0, "text": "x", "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    response = BatchResponse(status_code=status, request_id=custom_id, body=body)
    return BatchOutputLine(id=f"batch_req_{custom_id}", custom_id=custom_id, response=response)


def batch_with_input(tmp_path: Path, ids: list[str]) -> tuple[BatchStore, FileStore, BatchRecord]:
    files, store = FileStore(tmp_path / "files"), BatchStore(tmp_path / "batches")
    lines = b"".join(
        json.dumps({"custom_id": i, "url": "/v1/chat/completions", "body": {}}).encode() + b"\n"
        for i in ids
    )
    stored = files.save_upload(io.BytesIO(lines), "in.jsonl", "batch")
    batch = record(stored.id, total=len(ids))
    store.save(batch)
    return store, files, batch


def test_a_finished_run_is_split_into_output_and_error_files(tmp_path: Path) -> None:
    store, files, batch = batch_with_input(tmp_path, ["a", "b", "c"])
    writer = OutputWriter(store.output(batch.id))
    writer.write([answered("a"), answered("b", 400), answered("c")])
    writer.close()
    done = finish(store, files, batch, None)
    assert done.status == "completed" and done.completed_at is not None
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (3, 2, 1)
    assert done.usage is not None
    assert (done.usage["input_tokens"], done.usage["output_tokens"]) == (9, 6)
    assert done.usage["total_tokens"] == 15
    assert not store.output(batch.id).exists()  # split in two, then removed
    assert done.output_file_id is not None and done.error_file_id is not None
    ok = [json.loads(x) for x in files.path(done.output_file_id).read_bytes().splitlines()]
    bad = [json.loads(x) for x in files.path(done.error_file_id).read_bytes().splitlines()]
    assert [x["custom_id"] for x in ok] == ["a", "c"] and [x["custom_id"] for x in bad] == ["b"]
    assert files.get(done.output_file_id).purpose == "batch_output"  # type: ignore[union-attr]
    assert store.get(batch.id) == done


def test_a_cancelled_batch_answers_every_line_never_run_once_even_when_finished_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, files, batch = batch_with_input(tmp_path, ["a", "b", "c"])
    writer = OutputWriter(store.output(batch.id))
    writer.write([answered("b")])
    writer.close()
    with monkeypatch.context() as killed:  # a gateway killed while finishing, before the split
        killed.setattr("ops.gateway.batch_ending._split", Mock(side_effect=OSError("killed")))
        with pytest.raises(OSError):
            finish(store, files, batch, "cancelled")
    assert batch.status == "in_progress"  # the caller's record is left as it was
    done = finish(store, files, batch, "cancelled")
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    assert done.error_file_id is not None
    errors = [json.loads(x) for x in files.path(done.error_file_id).read_bytes().splitlines()]
    assert sorted(e["custom_id"] for e in errors) == ["a", "c"]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}


def test_an_expired_batch_that_never_ran_has_only_an_error_file(tmp_path: Path) -> None:
    store, files, batch = batch_with_input(tmp_path, ["a", "b"])
    done = finish(store, files, batch, "expired")
    assert done.status == "expired" and done.output_file_id is None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 2)


def test_answers_a_stop_cut_short_go_to_the_error_file_marked_with_why(tmp_path: Path) -> None:
    store, files, batch = batch_with_input(tmp_path, ["a", "b"])
    writer = OutputWriter(store.output(batch.id))
    writer.write([answered("a"), answered("b", finish_reason="cancelled")])
    writer.close()
    done = finish(store, files, batch, "expired")
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    assert done.error_file_id is not None
    [cut] = [json.loads(x) for x in files.path(done.error_file_id).read_bytes().splitlines()]
    assert cut["custom_id"] == "b" and cut["error"]["code"] == "batch_expired"
    assert cut["response"]["body"]["choices"][0]["text"] == "x"  # the tokens made are kept


def test_a_batch_whose_input_is_gone_fails(tmp_path: Path) -> None:
    store, files, batch = batch_with_input(tmp_path, ["a"])
    files.delete(batch.input_file_id)
    done = finish(store, files, batch, "failed")
    assert done.status == "failed" and done.failed_at is not None
    assert done.errors is not None and done.errors["data"][0]["code"] == "input_file_missing"
