"""`FileStore`: uploads checked line by line, records written after bytes, ids that stay inside."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ops.gateway.errors import ApiError
from ops.gateway.files import FileStore


def line(custom_id: str, url: str = "/v1/chat/completions") -> bytes:
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def test_an_upload_is_kept_whole_with_its_lines_and_urls(tmp_path: Path) -> None:
    files = FileStore(tmp_path)
    data = line("a") + b"\n\n" + line("b", "/v1/completions")  # a blank line; no final newline
    stored = files.save_upload(io.BytesIO(data), "in.jsonl", "batch")
    assert stored.id.startswith("file-") and stored.lines == 2
    assert stored.urls == ["/v1/chat/completions", "/v1/completions"]
    assert files.path(stored.id).read_bytes() == data + b"\n"
    assert files.get(stored.id) == stored
    assert stored.public()["object"] == "file" and "lines" not in stored.public()
    assert [f.id for f in files.listed()] == [stored.id]


def test_lines_that_are_not_requests_refuse_the_upload_and_leave_nothing(tmp_path: Path) -> None:
    files = FileStore(tmp_path)
    data = b"\n".join([line("a"), line("a"), b"[1]", line("c", "/v1/moderations")])
    with pytest.raises(ApiError) as refused:
        files.save_upload(io.BytesIO(data), "bad.jsonl", "batch")
    assert (refused.value.status, refused.value.code) == (400, "invalid_file")
    message = refused.value.message
    assert "line 2: duplicate_custom_id" in message and "line 3: invalid_json" in message
    assert "line 4: unsupported_url" in message
    assert list(tmp_path.iterdir()) == []


def test_a_long_list_of_faults_names_the_first_ten(tmp_path: Path) -> None:
    with pytest.raises(ApiError) as refused:
        FileStore(tmp_path).save_upload(io.BytesIO(b"x\n" * 25), "bad.jsonl", "batch")
    assert refused.value.message.startswith("25 lines are not batch requests")
    assert "(and 15 more)" in refused.value.message


@pytest.mark.parametrize(
    ("data", "purpose"), [(b"\n\n", "batch"), (b"", "batch"), (b"", "fine-tune")]
)
def test_an_empty_file_or_another_purpose_is_refused(
    tmp_path: Path, data: bytes, purpose: str
) -> None:
    with pytest.raises(ApiError) as refused:
        FileStore(tmp_path).save_upload(io.BytesIO(data), "in.jsonl", purpose)
    assert refused.value.status == 400


@pytest.mark.parametrize("name", ["../etc/passwd", "file-../../x", "", "file-a/b", ".file-x"])
def test_an_id_never_names_a_path_outside_the_folder(tmp_path: Path, name: str) -> None:
    files = FileStore(tmp_path / "files")
    assert files.path(name).parent == tmp_path / "files"
    assert files.get(name) is None
    assert files.delete(name) is False


def test_delete_removes_the_record_and_the_bytes(tmp_path: Path) -> None:
    files = FileStore(tmp_path)
    stored = files.save_upload(io.BytesIO(line("a")), "in.jsonl", "batch")
    assert files.delete(stored.id)
    assert files.get(stored.id) is None and not files.path(stored.id).exists()
    assert files.listed() == []


def test_a_line_past_the_line_limit_refuses_the_upload_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ops.gateway.files.MAX_LINE_BYTES", 64)
    with pytest.raises(ApiError) as refused:
        FileStore(tmp_path).save_upload(io.BytesIO(b"x" * 1000), "long.jsonl", "batch")
    assert "line 1 is over 64 bytes" in refused.value.message
