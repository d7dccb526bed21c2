"""gpu.encoder.engine on a tiny random-weight embedding model (`st_folders`): its vectors
against sentence-transformers' own on the same folder (every module of the pipeline, the
sliding window on both sides, truncation, prompts, Matryoshka dimensions, batched and alone),
and the engine's interface: the token budget, requests finishing, abort, admission."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu.encoder import EncoderEngine, is_embedding_model, load_encoder_engine
from gpu.encoder.inputs import embed_tokens, fit
from gpu.encoder.pipeline import read_pipeline
from gpu.engine_config import EngineConfig
from gpu.engine_io import EmbedJob, EngineRequest
from gpu.errors import RequestRejected, UnsupportedPipeline
from gpu.loading.loader import load_model
from messages.error_codes import ErrorCode
from tests.unit.gpu.encoder.st_folders import MAX_SEQ_LENGTH, WINDOW, write_embedding_model

pytestmark = pytest.mark.model  # builds and loads a (tiny) model

BUDGET = 64
TEXTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",  # longer than the window
    "def add(a, b):\n    return a + b  # ünïcödé, 日本語",
    "Kafka topics carry generation jobs; the worker answers each one exactly once. " * 3,
    "1234567890 + 42 = 1234567932",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedding_model(tmp_path_factory.mktemp("embedder"))


@pytest.fixture(scope="module")
def engine(folder: Path) -> EncoderEngine:
    return load_encoder_engine(folder, config=EngineConfig(max_num_batched_tokens=BUDGET))


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def tokens(engine: EncoderEngine, text: str, prompt_name: str | None = None) -> list[int]:
    spec = engine.embedding
    return fit(
        embed_tokens(engine.model.tokenizer, spec, text, prompt_name), spec.max_tokens, "end"
    )[0]


def cosines(ours: list[np.ndarray], theirs: np.ndarray) -> list[float]:
    return [
        float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
        for a, b in zip(ours, theirs, strict=True)
    ]


def test_the_spec_says_what_the_folder_does(engine: EncoderEngine, folder: Path) -> None:
    spec = engine.embedding
    assert (spec.dimensions, spec.max_tokens, spec.pooling) == (48, MAX_SEQ_LENGTH, "mean")
    assert spec.normalized and spec.specials == (1, 1) and spec.default_prompt_name is None
    assert set(spec.prompts) == {"query", "document", "empty"}
    assert engine.max_model_len == MAX_SEQ_LENGTH
    assert is_embedding_model(folder)
    lengths = [len(tokens(engine, t)) for t in TEXTS]
    assert max(lengths) == MAX_SEQ_LENGTH and any(WINDOW < n < MAX_SEQ_LENGTH for n in lengths)


@pytest.mark.parametrize("prompt_name", [None, "query", "document"])
def test_vectors_match_sentence_transformers(
    engine: EncoderEngine, reference: Any, prompt_name: str | None
) -> None:
    theirs = reference.encode(TEXTS, prompt_name=prompt_name)
    batched = engine.encode([tokens(engine, t, prompt_name) for t in TEXTS])
    alone = [engine.encode([tokens(engine, t, prompt_name)])[0] for t in TEXTS]
    assert min(cosines(batched, theirs)) >= 0.99999
    assert min(cosines(alone, theirs)) >= 0.99999
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in batched)


def test_matryoshka_dimensions_match_truncate_dim(engine: EncoderEngine, reference: Any) -> None:
    theirs = reference.encode(TEXTS, prompt_name="query", truncate_dim=16)
    ours = engine.encode([tokens(engine, t, "query") for t in TEXTS], dimensions=16)
    assert all(v.shape == (16,) and v.dtype == np.float32 for v in ours)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in ours)  # normalized again
    assert min(cosines(ours, theirs)) >= 0.99999


def request(engine: EncoderEngine, rid: str, texts: list[str], **job: Any) -> EngineRequest:
    inputs = tuple(tokens(engine, t) for t in texts)
    flat = [t for one in inputs for t in one]
    return EngineRequest(rid, flat, embed=EmbedJob(inputs, **job))


def run(engine: EncoderEngine) -> Iterator[Any]:
    while engine.has_work():
        yield engine.step()


def test_steps_pack_inputs_up_to_the_budget(engine: EncoderEngine) -> None:
    a = request(engine, "a", TEXTS)
    b = request(engine, "b", TEXTS[:2], dimensions=8)
    engine.add(a)
    engine.add(b)
    outputs = list(run(engine))
    for out in outputs:
        assert out.stats.num_prefill_tokens <= BUDGET or out.stats.num_seqs == 1
        assert out.new_tokens == [] and out.stats.num_decode_tokens == 0
    assert sum(o.stats.num_seqs for o in outputs) == len(TEXTS) + 2
    assert sum(o.stats.prompt_tokens for o in outputs) == len(a.prompt_token_ids) + len(
        b.prompt_token_ids
    )
    done = {c.request_id: c for o in outputs for c in o.finished}
    assert set(done) == {"a", "b"} and not engine.running
    assert done["a"].finish_reason == "stop" and done["a"].prompt_tokens == len(a.prompt_token_ids)
    expected = engine.encode(a.embed.inputs)  # type: ignore[union-attr]
    assert len(done["a"].embeddings) == len(TEXTS)
    for got, want in zip(done["a"].embeddings, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert [v.shape for v in done["b"].embeddings] == [(8,), (8,)]


def test_a_request_finishes_when_its_last_input_ran(engine: EncoderEngine) -> None:
    engine.add(request(engine, "long", [TEXTS[3], TEXTS[3], TEXTS[3]]))  # 40 tokens each
    first = engine.step()
    assert first.finished == [] and first.stats.num_seqs == 1 and engine.has_work()
    rest = list(run(engine))
    assert [c.request_id for o in rest for c in o.finished] == ["long"]


def test_higher_priority_runs_first(engine: EncoderEngine) -> None:
    engine.add(request(engine, "low", [TEXTS[3]]))
    engine.add(replace(request(engine, "high", [TEXTS[3]]), priority=5))
    assert [c.request_id for c in engine.step().finished] == ["high"]
    assert [c.request_id for c in engine.step().finished] == ["low"]


def test_abort_drops_queued_inputs(engine: EncoderEngine) -> None:
    engine.add(request(engine, "x", TEXTS))
    done = engine.abort("x")
    assert done is not None and done.finish_reason == "cancelled" and done.embeddings == ()
    assert not engine.has_work() and engine.abort("x") is None


@pytest.mark.parametrize(
    ("job", "code"),
    [
        (EmbedJob(()), ErrorCode.EMPTY_PROMPT),
        (EmbedJob(([2, 1], [])), ErrorCode.EMPTY_PROMPT),
        (EmbedJob(([2] * (MAX_SEQ_LENGTH + 1),)), ErrorCode.PROMPT_TOO_LONG),
        (EmbedJob(([2, 10**6, 1],)), ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        (EmbedJob(([2, 1],), dimensions=0), ErrorCode.INVALID_DIMENSIONS),
        (EmbedJob(([2, 1],), dimensions=49), ErrorCode.INVALID_DIMENSIONS),
    ],
)
def test_admission_refuses_with_typed_codes(
    engine: EncoderEngine, job: EmbedJob, code: ErrorCode
) -> None:
    with pytest.raises(RequestRejected) as caught:
        engine.add(EngineRequest("bad", [], embed=job))
    assert caught.value.code == code and not engine.has_work()


def test_only_embedding_requests_and_no_duplicates(engine: EncoderEngine) -> None:
    with pytest.raises(ValueError, match="not an embedding request"):
        engine.add(EngineRequest("gen", [2, 5, 1]))
    engine.add(request(engine, "dup", ["hello"]))
    with pytest.raises(RequestRejected) as caught:
        engine.add(request(engine, "dup", ["hello"]))
    assert caught.value.code == ErrorCode.DUPLICATE_REQUEST
    list(run(engine))


def test_the_bare_model_loads_without_a_head(folder: Path) -> None:
    model = load_model(folder)
    assert model.config.bidirectional and model.config.sliding_window == WINDOW
    assert model.module.lm_head is None
    with pytest.raises(TypeError, match="no LM head"):
        model.module(None, None, None)


def test_a_causal_model_is_not_an_encoder(folder: Path) -> None:
    model = load_model(folder)
    model.config = replace(model.config, bidirectional=False)
    with pytest.raises(UnsupportedPipeline, match="bidirectional"):
        EncoderEngine(model, read_pipeline(folder))


def test_encode_refuses_as_add_does(engine: EncoderEngine) -> None:
    assert engine.encode([]) == []
    with pytest.raises(ValueError, match="dimensions"):
        engine.encode([[2, 1]], dimensions=49)
    with pytest.raises(ValueError, match="no tokens"):
        engine.encode([[2, 1], []])
