"""The Files and Batches routes over a folder, without Kafka (no batch is created here: a
created batch runs, and runs go through Kafka: tests/integration/test_gateway_batches.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from actors.kafka.connection import KafkaConnection
from ops.gateway.app import build_app
from ops.gateway.batch_runner import BatchRunner
from ops.gateway.batches import BatchStore
from ops.gateway.files import FileStore
from ops.gateway.keys import KeyCheck
from ops.gateway.service import Gateway
from ops.gateway.settings import GatewaySettings

KEY = "sk-routes"
AUTH = {"authorization": f"Bearer {KEY}"}
LINE = {"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "Hi"}}


@pytest.fixture
def http(tmp_path: Path) -> TestClient:
    settings = GatewaySettings(batch_dir=str(tmp_path))
    files = FileStore(tmp_path / "files")
    runner = BatchRunner(
        BatchStore(tmp_path / "batches"), files, KafkaConnection("127.0.0.1:1"), settings, "r"
    )
    gateway = Gateway(settings, None, "t")  # type: ignore[arg-type]  # no request is sent
    return TestClient(build_app(gateway, KeyCheck((KEY.encode(),)), None, runner))


def test_a_file_is_uploaded_listed_read_and_deleted(http: TestClient) -> None:
    data = json.dumps(LINE).encode() + b"\n"
    made = http.post("/v1/files", headers=AUTH, files={"file": ("in.jsonl", data)},
                     data={"purpose": "batch"})  # fmt: skip
    assert made.status_code == 200, made.text
    file_id = made.json()["id"]
    assert [f["id"] for f in http.get("/v1/files", headers=AUTH).json()["data"]] == [file_id]
    assert http.get(f"/v1/files/{file_id}", headers=AUTH).json()["bytes"] == len(data)
    assert http.get(f"/v1/files/{file_id}/content", headers=AUTH).content == data
    assert http.delete(f"/v1/files/{file_id}", headers=AUTH).json()["deleted"] is True
    assert http.get(f"/v1/files/{file_id}", headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/files"), ("GET", "/v1/batches"), ("POST", "/v1/files"),
     ("GET", "/v1/batches/batch_x"), ("POST", "/v1/batches/batch_x/cancel")],
)  # fmt: skip
def test_every_route_asks_for_a_key(http: TestClient, method: str, path: str) -> None:
    answered = http.request(method, path, headers={"content-length": "0"})
    assert answered.status_code == 401
    assert answered.json()["error"]["code"] == "invalid_api_key"


def test_errors_are_openai_s_shape(http: TestClient) -> None:
    missing = http.get("/v1/batches/batch_nosuch", headers=AUTH)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    bad_limit = http.get("/v1/batches?limit=many", headers=AUTH)
    assert bad_limit.status_code == 400 and bad_limit.json()["error"]["param"] == "query.limit"
    no_file = http.post("/v1/batches", headers=AUTH, json={
        "input_file_id": "file-nosuch", "endpoint": "/v1/completions"})  # fmt: skip
    assert (no_file.status_code, no_file.json()["error"]["code"]) == (400, "invalid_input_file")
    listed = http.get("/v1/batches", headers=AUTH).json()
    assert listed == {"object": "list", "data": [], "first_id": None, "last_id": None,
                      "has_more": False}  # fmt: skip
