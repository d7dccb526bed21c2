"""The gateway's routers with fakes of what lies behind them (no Kafka): which routes ask for
a key, the errors routing itself answers, CORS, readiness, model cards, a fleet that is down,
and tokenizing with a tokenizer read on this host."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer, models, pre_tokenizers

from actors.kafka.connection import KafkaConnection
from messages.chunk import GenerateChunk
from messages.events import WorkerStarted
from messages.request import GenerateRequest
from messages.result import FinishReason, GenerateResult, ModelRef
from ops.gateway.app import build_app
from ops.gateway.batch_runner import BatchRunner
from ops.gateway.batches import BatchStore
from ops.gateway.files import FileStore
from ops.gateway.fleet import FleetWatch
from ops.gateway.keys import KeyCheck
from ops.gateway.replies import Reply
from ops.gateway.service import Gateway
from ops.gateway.settings import GatewaySettings

KEY = "sk-routes"
AUTH = {"authorization": f"Bearer {KEY}"}
NOWHERE = KafkaConnection("127.0.0.1:1")  # nothing here reaches Kafka
OPEN = {"/health", "/healthz", "/readyz", "/metrics", "/version"}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


class AnsweringReplies:
    """`Replies` that answer every request at once, and remember what was sent."""

    reply_topic = "replies"
    dropped = 0

    def __init__(self) -> None:
        self.sent: list[GenerateRequest] = []

    def open(self, request_id: str) -> asyncio.Queue[Reply]:
        queue: asyncio.Queue[Reply] = asyncio.Queue()
        queue.put_nowait(GenerateChunk(id=request_id, token_ids=[7], text="Hi"))
        result = GenerateResult(
            id=request_id, text="Hi", token_ids=[7], finish_reason=FinishReason.STOP
        )
        queue.put_nowait(result)
        return queue

    async def send(self, request: GenerateRequest, trace: object) -> None:
        self.sent.append(request)

    def close(self, request_id: str) -> None:
        pass


def watch(*served: tuple[str, int], caught_up: bool = True) -> FleetWatch:
    """A fleet watch never started, as if it had read workers serving `served` (name, len)."""
    fleet = FleetWatch(NOWHERE, "events")
    for n, (name, max_len) in enumerate(served):
        fleet.fleet.apply(
            WorkerStarted(
                worker=f"w{n}", at=100.0 + n, model=ModelRef(name=name, digest=f"sha256:{name}"),
                group="g", requests_topic="r", max_model_len=max_len,
            )
        )  # fmt: skip
    fleet.caught_up = caught_up
    return fleet


def app_with(
    tmp_path: Path,
    fleet: FleetWatch | None,
    replies: AnsweringReplies | None = None,
    **settings: Any,
) -> TestClient:
    """The app, not started (no lifespan: nothing reaches Kafka)."""
    config = replace(GatewaySettings(batch_dir=str(tmp_path)), **settings)
    files = FileStore(tmp_path / "files")
    runner = BatchRunner(BatchStore(tmp_path / "batches"), files, NOWHERE, config, "r")
    gateway = Gateway(config, replies or AnsweringReplies(), "t")  # type: ignore[arg-type]
    return TestClient(build_app(gateway, KeyCheck((KEY.encode(),)), fleet, runner))


@pytest.fixture
def http(tmp_path: Path) -> TestClient:
    return app_with(tmp_path, watch(("smollm2", 2048)))


def test_every_route_but_the_open_ones_asks_for_a_key(http: TestClient) -> None:
    asked = set(http.app.state.served)  # type: ignore[attr-defined]
    assert {p for _, p in asked} >= OPEN | {"/v1/completions", "/tokenize", "/v1/batches"}
    for method, path in sorted(asked):
        url = path.replace("{file_id}", "f").replace("{batch_id}", "b")
        url = url.replace("{model_id}", "m")
        answered = http.request(method, url, headers={"content-length": "0"})
        if path in OPEN:
            assert answered.status_code != 401, (method, path)
        else:
            assert answered.status_code == 401, (method, path)
            assert answered.json()["error"]["code"] == "invalid_api_key"


def test_an_unserved_path_is_a_404_that_names_it(http: TestClient) -> None:
    answered = http.post("/v1/foo", headers=AUTH, json={})
    assert answered.status_code == 404
    error = answered.json()["error"]
    assert (error["code"], error["type"]) == ("unknown_url", "invalid_request_error")
    assert error["message"].startswith("POST /v1/foo is not served by this gateway; served: ")
    assert "/v1/chat/completions" in error["message"]


def test_a_wrong_method_is_a_405_that_says_which_are_served(http: TestClient) -> None:
    answered = http.get("/v1/completions", headers=AUTH)
    assert answered.status_code == 405
    assert answered.json()["error"]["code"] == "method_not_allowed"
    assert "GET /v1/completions" in answered.json()["error"]["message"]
    assert answered.headers["allow"] == "POST"


def test_cors_headers_only_for_the_allowed_origins(tmp_path: Path) -> None:
    preflight = {
        "origin": "https://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type",
    }
    without = app_with(tmp_path, None).options("/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in without.headers
    http = app_with(tmp_path, None, allowed_origins=("https://app.example",))
    allowed = http.options("/v1/chat/completions", headers=preflight)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    other = http.options(
        "/v1/chat/completions", headers=preflight | {"origin": "https://x.example"}
    )
    assert "access-control-allow-origin" not in other.headers
    simple = http.get("/v1/models", headers=AUTH | {"origin": "https://app.example"})
    assert simple.headers["access-control-allow-origin"] == "https://app.example"


@pytest.mark.parametrize(
    ("served", "body"),
    [((), CHAT), ((), CHAT | {"model": "smollm2"}), ((("smollm2", 0),), CHAT | {"model": "gemma"})],
)
def test_with_no_live_worker_for_the_model_it_is_a_503_at_once(
    tmp_path: Path, served: tuple[tuple[str, int], ...], body: dict[str, Any]
) -> None:
    replies = AnsweringReplies()
    http = app_with(tmp_path, watch(*served), replies)
    answered = http.post("/v1/chat/completions", headers=AUTH, json=body)
    assert answered.status_code == 503
    error = answered.json()["error"]
    assert (error["code"], error["type"]) == ("no_worker", "server_error")
    assert int(answered.headers["retry-after"]) > 0
    assert answered.headers["x-request-id"]
    assert replies.sent == [], "nothing sent that no worker would answer"


@pytest.mark.parametrize(
    ("fleet", "model"),
    [
        (lambda: watch(("smollm2", 0)), "smollm2"),  # the name it announced
        (lambda: watch(("smollm2", 0)), "sha256:smollm2"),  # its digest
        (lambda: watch(("/m/SmolLM2.gguf", 0)), "SmolLM2"),  # a path's stem
        (lambda: watch(("smollm2", 0)), None),  # any model
        (lambda: watch(caught_up=False), "smollm2"),  # the events not read yet: unknown
        (lambda: None, "smollm2"),  # no fleet watch: never refused
    ],
)
def test_a_request_a_live_worker_may_serve_is_sent(
    tmp_path: Path, fleet: Any, model: str | None
) -> None:
    replies = AnsweringReplies()
    http = app_with(tmp_path, fleet(), replies)
    body = CHAT | ({"model": model} if model else {})
    answered = http.post("/v1/chat/completions", headers=AUTH, json=body)
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "Hi"
    assert [r.model for r in replies.sent] == [model]


def test_readyz_answers_503_while_no_worker_is_listed(tmp_path: Path) -> None:
    assert app_with(tmp_path, watch()).get("/readyz").status_code == 503
    assert app_with(tmp_path, watch(caught_up=False)).get("/readyz").status_code == 503
    ready = app_with(tmp_path, watch(("smollm2", 0))).get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == ["smollm2"]


def test_model_cards_carry_max_model_len_and_an_unserved_one_is_404(http: TestClient) -> None:
    card = {"id": "smollm2", "object": "model", "created": 100, "owned_by": "tokenmill",
            "max_model_len": 2048, "task": "generate"}  # fmt: skip
    assert http.get("/v1/models", headers=AUTH).json()["data"] == [card]
    assert http.get("/v1/models/smollm2", headers=AUTH).json() == card
    missing = http.get("/v1/models/gemma", headers=AUTH)
    assert missing.status_code == 404
    assert (missing.json()["error"]["code"], missing.json()["error"]["param"]) == (
        "model_not_found",
        "model",
    )


def test_a_path_named_model_is_found_by_its_path(tmp_path: Path) -> None:
    http = app_with(tmp_path, watch(("/models/tiny-llama", 64)))
    found = http.get("/v1/models//models/tiny-llama", headers=AUTH)
    assert found.status_code == 200 and found.json()["max_model_len"] == 64


def test_health_is_200_empty_and_version_names_tokenmill_s(http: TestClient) -> None:
    health = http.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert http.get("/version").json()["version"]


def test_tokenize_names_what_it_cannot_do(http: TestClient) -> None:
    unserved = http.post("/tokenize", headers=AUTH, json={"model": "gemma", "prompt": "Hi"})
    assert (unserved.status_code, unserved.json()["error"]["code"]) == (404, "model_not_found")
    absent = http.post("/tokenize", headers=AUTH, json={"model": "smollm2", "prompt": "Hi"})
    assert absent.status_code == 503
    assert absent.json()["error"]["code"] == "tokenizer_unavailable"
    assert "not available on the gateway's host" in absent.json()["error"]["message"]
    bad = http.post("/detokenize", headers=AUTH, json={"model": "smollm2", "tokens": "x"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_body")


def tokenizer_folder(folder: Path) -> Path:
    """An HF folder with a word-level tokenizer of four tokens (no weights: none is read)."""
    vocab = {"<eos>": 0, "hello": 1, "world": 2, "[UNK]": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 4, "max_position_embeddings": 512,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_tokenize_and_detokenize_round_trip_with_a_tokenizer_on_this_host(tmp_path: Path) -> None:
    model = str(tokenizer_folder(tmp_path / "tiny"))
    http = app_with(tmp_path, watch((model, 128)))
    text = "hello world"
    made = http.post("/tokenize", headers=AUTH, json={"prompt": text, "add_special_tokens": False})
    assert made.status_code == 200, made.text
    tokens = made.json()["tokens"]
    assert made.json() == {"count": 2, "max_model_len": 128, "tokens": [1, 2], "token_strs": None}
    back = http.post("/detokenize", headers=AUTH, json={"model": model, "tokens": tokens})
    assert back.json() == {"prompt": text}
    outside = http.post("/detokenize", headers=AUTH, json={"model": model, "tokens": [10**6]})
    assert (outside.status_code, outside.json()["error"]["param"]) == (400, "tokens")


def test_fields_the_mapping_ignored_are_named_in_a_header(http: TestClient) -> None:
    body = {**CHAT, "frobnicate": 1, "best_of_n": 2}
    answered = http.post("/v1/chat/completions", headers=AUTH, json=body)
    assert answered.status_code == 200
    assert answered.headers["x-tokenmill-ignored-fields"] == "frobnicate,best_of_n"
