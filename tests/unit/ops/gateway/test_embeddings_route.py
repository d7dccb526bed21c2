"""`POST /v1/embeddings` with a fake of the workers behind it (no Kafka): the `openai` SDK's
`embeddings.create` (its default base64 decoded by itself, floats, a list), the request sent,
errors in OpenAI's shape, unknown fields, a model for the other task, model cards."""

from __future__ import annotations

import asyncio
import base64
import struct
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from messages.embedding import Embedding, EmbedRequest, EmbedResult, EmbedUsage
from messages.error_codes import ErrorCode
from messages.events import WorkerStarted
from messages.request_kinds import Request
from messages.result import ErrorInfo, ModelRef
from ops.gateway.fleet import FleetWatch
from ops.gateway.replies import Reply
from tests.unit.ops.gateway.test_routes import AUTH, KEY, NOWHERE, app_with

EMBEDDER = "embeddinggemma-300m"
WIDTH = 4


def vector_of(text: str, dimensions: int | None) -> list[float]:
    """A made-up vector (exactly representable in float32) standing for the model's."""
    return [float(len(text) + i) / 8 for i in range(dimensions or WIDTH)]


class EmbeddingWorkers:
    """`Replies` whose workers embed every input at once (base64 when asked, as the worker
    writes it: float32, little-endian), and remember what was sent; `error`: refuse instead."""

    reply_topic = "replies"
    dropped = 0

    def __init__(self, error: ErrorInfo | None = None) -> None:
        self.sent: list[EmbedRequest] = []
        self.error = error
        self._queues: dict[str, asyncio.Queue[Reply]] = {}

    def open(self, request_id: str) -> asyncio.Queue[Reply]:
        self._queues[request_id] = asyncio.Queue()
        return self._queues[request_id]

    async def send(self, request: Request, trace: object) -> None:
        assert isinstance(request, EmbedRequest)
        self.sent.append(request)
        texts = [request.input] if isinstance(request.input, str) else request.input or []
        data = []
        for i, text in enumerate(texts):
            values = vector_of(str(text), request.dimensions)
            packed = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
            data.append(
                Embedding(
                    index=i, embedding=packed if request.encoding_format == "base64" else values
                )
            )
        result = EmbedResult(
            id=request.id,
            data=[] if self.error else data,
            usage=EmbedUsage(prompt_tokens=3 * len(texts), total_tokens=3 * len(texts)),
            model=ModelRef(name=EMBEDDER, digest="sha256:e", task="embed"),
            worker="w-embed",
            error=self.error,
        )
        self._queues[request.id].put_nowait(result)

    def close(self, request_id: str) -> None:
        self._queues.pop(request_id, None)


def fleet_of(*models: tuple[str, str]) -> FleetWatch:
    """A fleet watch never started, as if it had read workers serving `models` (name, task)."""
    fleet = FleetWatch(NOWHERE, "events")
    for n, (name, task) in enumerate(models):
        model = ModelRef(name=name, digest=f"sha256:{name}", task=task)
        fleet.fleet.apply(
            WorkerStarted(
                worker=f"w{n}",
                at=100.0 + n,
                model=model,
                group="g",
                requests_topic="r",
                max_model_len=2048,
            )
        )
    fleet.caught_up = True
    return fleet


def gateway(tmp_path: Path, workers: EmbeddingWorkers, **settings: Any) -> TestClient:
    fleet = fleet_of((EMBEDDER, "embed"), ("smollm2", ""))
    return app_with(tmp_path, fleet, workers, **settings)  # type: ignore[arg-type]


def sdk(http: TestClient) -> openai.OpenAI:
    return openai.OpenAI(api_key=KEY, base_url="http://testserver/v1", http_client=http)


def test_the_sdk_s_default_asks_base64_and_decodes_it_to_the_worker_s_floats(
    tmp_path: Path,
) -> None:
    workers = EmbeddingWorkers()
    answer = sdk(gateway(tmp_path, workers)).embeddings.create(model=EMBEDDER, input="Kafka")
    assert workers.sent[0].encoding_format == "base64"  # what the SDK asked
    assert [d.embedding for d in answer.data] == [vector_of("Kafka", None)]
    assert (answer.model, answer.object, answer.usage.prompt_tokens) == (EMBEDDER, "list", 3)


def test_floats_a_list_and_dimensions_through_the_sdk(tmp_path: Path) -> None:
    workers = EmbeddingWorkers()
    client = sdk(gateway(tmp_path, workers))
    texts = ["a", "bb", "ccc"]
    answer = client.embeddings.create(
        model=EMBEDDER, input=texts, encoding_format="float", dimensions=2
    )
    assert [d.index for d in answer.data] == [0, 1, 2]
    assert [d.embedding for d in answer.data] == [vector_of(t, 2) for t in texts]
    assert (workers.sent[0].dimensions, workers.sent[0].input) == (2, texts)
    asked = client.embeddings.create(model=EMBEDDER, input=[[2, 7, 1]], encoding_format="base64")
    assert isinstance(asked.data[0].embedding, str)  # named explicitly: left to the caller


def test_the_extras_of_tei_and_vllm_reach_the_request(tmp_path: Path) -> None:
    workers = EmbeddingWorkers()
    http = gateway(tmp_path, workers)
    body = {"model": EMBEDDER, "input": "q", "prompt_name": "query", "truncate": True}
    answered = http.post("/v1/embeddings", headers=AUTH, json=body)
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-request-id"] == workers.sent[0].id
    assert answered.headers["x-tokenmill-worker"] == "w-embed"
    assert (workers.sent[0].prompt_name, workers.sent[0].truncate) == ("query", "end")
    assert workers.sent[0].reply_to is None  # set by the real `Replies.send`
    vllm = {"model": EMBEDDER, "input": "q", "truncate_prompt_tokens": -1}
    assert http.post("/v1/embeddings", headers=AUTH, json=vllm).status_code == 200
    assert workers.sent[1].truncate == "start"


def test_unknown_fields_are_named_in_a_header_or_refused_when_strict(tmp_path: Path) -> None:
    body = {"model": EMBEDDER, "input": "q", "normalize": True, "user": "u1"}
    answered = gateway(tmp_path, EmbeddingWorkers()).post("/v1/embeddings", headers=AUTH, json=body)
    assert answered.status_code == 200
    assert answered.headers["x-tokenmill-ignored-fields"] == "normalize"
    strict = gateway(tmp_path, EmbeddingWorkers(), strict_fields=True)
    refused = strict.post("/v1/embeddings", headers=AUTH, json=body)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unsupported_parameter"
    assert refused.json()["error"]["param"] == "normalize"


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": ""}, "empty_prompt", "input"),
        ({"input": ["a", 1]}, "invalid_prompt", "input"),
        ({"input": "a", "dimensions": 0}, "invalid_dimensions", "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "invalid_body", "encoding_format"),
        ({"model": EMBEDDER}, "invalid_body", "input"),
    ],
)
def test_a_body_that_cannot_be_embedded_is_a_400_in_openai_s_shape(
    tmp_path: Path, body: dict[str, Any], code: str, param: str
) -> None:
    workers = EmbeddingWorkers()
    answered = gateway(tmp_path, workers).post("/v1/embeddings", headers=AUTH, json=body)
    assert answered.status_code == 400
    error = answered.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert answered.headers["x-request-id"].startswith("gw-")
    assert workers.sent == []


def test_the_sdk_raises_the_worker_s_refusal(tmp_path: Path) -> None:
    error = ErrorInfo(code=ErrorCode.UNKNOWN_PROMPT_NAME, message="no task prompt 'q'")
    client = sdk(gateway(tmp_path, EmbeddingWorkers(error)))
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=EMBEDDER, input="x", extra_body={"prompt_name": "q"})
    assert raised.value.code == "unknown_prompt_name"


def test_each_door_refuses_a_model_for_the_other_task_at_once(tmp_path: Path) -> None:
    workers = EmbeddingWorkers()
    http = gateway(tmp_path, workers)
    chat = {"model": EMBEDDER, "messages": [{"role": "user", "content": "Hi"}]}
    for url, body in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", {"model": EMBEDDER, "prompt": "Hi"}),
        ("/v1/embeddings", {"model": "smollm2", "input": "Hi"}),
    ]:
        answered = http.post(url, headers=AUTH, json=body)
        assert answered.status_code == 400, (url, answered.text)
        error = answered.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_task", "model"), url
        assert "/v1/embeddings" in error["message"]
    assert workers.sent == []
    with pytest.raises(openai.BadRequestError, match="for embeddings"):
        sdk(http).chat.completions.create(
            model=EMBEDDER, messages=[{"role": "user", "content": "x"}]
        )


def test_a_fleet_that_only_embeds_refuses_a_generation_naming_no_model(tmp_path: Path) -> None:
    http = app_with(tmp_path, fleet_of((EMBEDDER, "embed")), EmbeddingWorkers())  # type: ignore[arg-type]
    answered = http.post("/v1/completions", headers=AUTH, json={"prompt": "Hi"})
    assert (answered.status_code, answered.json()["error"]["code"]) == (400, "unsupported_task")
    assert http.post("/v1/embeddings", headers=AUTH, json={"input": "Hi"}).status_code == 200


def test_an_unserved_model_is_a_503_as_at_the_other_doors(tmp_path: Path) -> None:
    body = {"model": "gpt-embed", "input": "Hi"}
    answered = gateway(tmp_path, EmbeddingWorkers()).post("/v1/embeddings", headers=AUTH, json=body)
    assert (answered.status_code, answered.json()["error"]["code"]) == (503, "no_worker")


def test_model_cards_say_which_models_embed(tmp_path: Path) -> None:
    client = sdk(gateway(tmp_path, EmbeddingWorkers()))
    cards = {m.id: m.model_extra or {} for m in client.models.list()}
    assert (cards[EMBEDDER]["task"], cards["smollm2"]["task"]) == ("embed", "generate")
    assert (client.models.retrieve(EMBEDDER).model_extra or {})["task"] == "embed"


def test_the_route_asks_for_a_key_and_is_counted(tmp_path: Path) -> None:
    http = gateway(tmp_path, EmbeddingWorkers())
    assert http.post("/v1/embeddings", json={"input": "x"}).status_code == 401
    http.post("/v1/embeddings", headers=AUTH, json={"input": "x"})
    http.post("/v1/embeddings", headers=AUTH, json={"input": ""})
    metrics = http.get("/metrics").text
    assert (
        'tokenmill_gateway_requests_total{code="",endpoint="embeddings",status="200"} 1.0'
        in metrics
    )
    assert (
        'tokenmill_gateway_requests_total{code="empty_prompt",endpoint="embeddings",status="400"}'
        in metrics
    )
