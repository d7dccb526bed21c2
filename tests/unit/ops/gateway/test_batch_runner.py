"""`BatchRunner` without Kafka: what a gateway finds in its folder at start, and cancels that
come too late. (Runs through Kafka: tests/integration/test_gateway_batches.py.)"""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from actors.kafka.connection import KafkaConnection
from messages.openai_batch import BatchOutputLine, BatchResponse
from ops.batch.output import OutputWriter
from ops.gateway.batch_runner import BatchRunner
from ops.gateway.batches import BatchRecord, BatchStore, new_batch_id
from ops.gateway.files import FileStore
from ops.gateway.settings import GatewaySettings

NOWHERE = KafkaConnection("127.0.0.1:1")  # a run that reached Kafka would fail here


def runner_with(tmp_path: Path, status: str, answered: list[str]) -> tuple[BatchRunner, str]:
    """A folder with one batch of lines a, b in `status`, its output answering `answered`."""
    files, store = FileStore(tmp_path / "files"), BatchStore(tmp_path / "batches")
    lines = b"".join(
        json.dumps({"custom_id": i, "url": "/v1/completions", "body": {}}).encode() + b"\n"
        for i in ("a", "b")
    )
    stored = files.save_upload(io.BytesIO(lines), "in.jsonl", "batch")
    record = BatchRecord(
        id=new_batch_id(), endpoint="/v1/completions", input_file_id=stored.id,
        completion_window="24h", window_s=86400, created_at=1, expires_at=2**40, status=status,
    )  # fmt: skip
    record.request_counts.total = 2
    if status == "cancelling":
        record.cancelling_at = 1
    store.save(record)
    writer = OutputWriter(store.output(record.id))
    writer.write(
        BatchOutputLine(id=f"r-{i}", custom_id=i, response=BatchResponse(
            status_code=200, request_id=i, body={"choices": [{"finish_reason": "stop"}]}))
        for i in answered
    )  # fmt: skip
    writer.close()
    settings = GatewaySettings(batch_dir=str(tmp_path))
    return BatchRunner(store, files, NOWHERE, settings, "replies.results"), record.id


async def ended(runner: BatchRunner, batch_id: str) -> BatchRecord:
    await runner.start()
    deadline = time.monotonic() + 60
    try:
        while True:
            record = runner.store.get(batch_id)
            if record is not None and record.final:
                return record
            assert time.monotonic() < deadline, record
            await asyncio.sleep(0.01)  # the runner ends it in a task of its own
    finally:
        await runner.stop()


async def test_a_batch_left_finalizing_is_finished_without_running_again(tmp_path: Path) -> None:
    runner, batch_id = runner_with(tmp_path, "finalizing", ["a", "b"])
    record = await ended(runner, batch_id)
    assert record.status == "completed"
    assert (record.request_counts.completed, record.request_counts.failed) == (2, 0)


async def test_a_batch_left_cancelling_ends_cancelled_with_every_line_answered(
    tmp_path: Path,
) -> None:
    runner, batch_id = runner_with(tmp_path, "cancelling", ["a"])
    record = await ended(runner, batch_id)
    assert record.status == "cancelled"
    assert (record.request_counts.completed, record.request_counts.failed) == (1, 1)


def test_a_cancel_while_finalizing_changes_nothing(tmp_path: Path) -> None:
    runner, batch_id = runner_with(tmp_path, "finalizing", ["a", "b"])
    assert runner.cancel(batch_id).status == "finalizing"
    assert not runner.store.cancel_asked(batch_id).exists()


async def test_a_cancel_that_comes_as_the_last_line_is_answered_ends_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, batch_id = runner_with(tmp_path, "in_progress", ["a", "b"])

    async def answered_every_line(options: object, progress: object) -> SimpleNamespace:
        runner.cancel(batch_id)  # asked while the run wrote its last answer
        return SimpleNamespace(complete=True, cancel_requested=False)

    monkeypatch.setattr("ops.gateway.batch_runner.run_batch", answered_every_line)
    record = await ended(runner, batch_id)
    assert record.status == "cancelled" and record.cancelled_at is not None
    assert (record.request_counts.completed, record.request_counts.failed) == (2, 0)
    assert record.output_file_id is not None, "the answers given stay in the output file"
    assert runner.files.path(record.output_file_id).read_bytes().count(b"\n") == 2
