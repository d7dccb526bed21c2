"""The embed bench's parts that need no model: driving an encoder as the worker does, the
rounds, the batch-size sweep, the agreement and the report's shape, all against fakes."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpu.encoder.spec import EmbeddingSpec
from gpu.engine_io import Completion, EngineRequest
from ops.bench.embed import OURS, ST, VLLM, EmbedBenchOptions, EngineContender, measure
from ops.bench.embed_rounds import agreement, best_batch_size, run_rounds

DIMS = 8


def _vector(tokens: Sequence[int]) -> np.ndarray:
    """A unit vector determined by the tokens (what every fake model "computes")."""
    seed = int.from_bytes(hashlib.sha256(bytes(str(list(tokens)), "utf8")).digest()[:4], "big")
    v = np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32)
    return v / np.linalg.norm(v)


def _tokenize(text: str) -> list[int]:
    return [2, *(len(word) for word in text.split()[:62]), 1]


class FakeEncoder:
    """An encoder engine's EngineLike surface: inputs packed per step up to the token budget."""

    embedding = EmbeddingSpec(dimensions=DIMS, max_tokens=64, prompts={"query": "q: "})

    def __init__(self, budget: int = 128) -> None:
        self.budget = budget
        self.queue: list[EngineRequest] = []
        self.prepared: set[str] = set()
        self.steps: list[int] = []  # tokens per step

    def prepare(self, request: EngineRequest) -> None:
        self.prepared.add(request.request_id)

    def add(self, request: EngineRequest) -> None:
        if request.embed is None:
            raise ValueError("not an embedding request")
        assert request.request_id in self.prepared
        self.queue.append(request)

    def has_work(self) -> bool:
        return bool(self.queue)

    def step(self) -> Any:
        taken, tokens = [], 0
        while self.queue and (
            not taken or tokens + len(self.queue[0].prompt_token_ids) <= self.budget
        ):
            request = self.queue.pop(0)
            taken.append(request)
            tokens += len(request.prompt_token_ids)
        self.steps.append(tokens)
        finished = [
            Completion(r.request_id, len(r.prompt_token_ids), [], "", "stop", 0.0, None, 0.0, 0,
                       embeddings=tuple(_vector(ids) for ids in r.embed.inputs))  # type: ignore[union-attr]
            for r in reversed(taken)  # out of order, as a real step may finish them
        ]  # fmt: skip
        return SimpleNamespace(finished=finished, new_tokens=[])

    def encode(
        self, inputs: Sequence[Sequence[int]], dimensions: int | None = None
    ) -> list[np.ndarray]:
        return [_vector(ids) for ids in inputs]


class FakeST:
    """sentence-transformers' `encode`, with a small error on every vector."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def encode(
        self, texts: list[str], *, batch_size: int, prompt_name: str | None, **_: Any
    ) -> np.ndarray:
        self.batch_sizes.append(batch_size)
        prefix = "q: " if prompt_name == "query" else ""
        rows = [
            _vector(_tokenize(prefix + t)) + np.eye(DIMS, dtype=np.float32)[0] * 0.05 for t in texts
        ]
        return np.stack([r / np.linalg.norm(r) for r in rows])


class FakeVllm:
    name = VLLM

    def __init__(self, running: bool) -> None:
        self.running = running
        self.status = {"ran": running} | ({} if running else {"reason": "exited with status 1"})
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return np.stack([_vector(_tokenize(t)) for t in texts])


def test_the_engine_is_driven_request_by_request_within_its_budget() -> None:
    engine = FakeEncoder(budget=40)
    texts = ["one two three", "a much longer text " * 10, "short"]
    vectors = EngineContender(engine, _tokenize).embed(texts)
    assert vectors.shape == (3, DIMS)
    for text, row in zip(texts, vectors, strict=True):  # in the texts' order
        np.testing.assert_array_equal(row, _vector(_tokenize(text)))
    assert len(engine.steps) > 1 and not engine.has_work()
    direct = EngineContender(engine, _tokenize, direct=True).embed(texts)
    np.testing.assert_array_equal(direct, vectors)


def test_rounds_alternate_and_keep_the_last_vectors() -> None:
    order: list[str] = []

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        def embed(self, texts: Sequence[str]) -> np.ndarray:
            order.append(self.name)
            return np.ones((len(texts), 2), dtype=np.float32)

    timings = run_rounds([Named("a"), Named("b")], ["x"] * 6, 3, lambda _: None)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-ups, then the rounds
    assert [len(t.seconds) for t in timings.values()] == [3, 3]
    assert timings["a"].vectors is not None and timings["a"].vectors.shape == (6, 2)


def test_a_contender_giving_too_few_vectors_is_an_error() -> None:
    class Short:
        name = "short"

        def embed(self, texts: Sequence[str]) -> np.ndarray:
            return np.ones((max(1, len(texts) - 1), 2), dtype=np.float32)

    with pytest.raises(RuntimeError, match="gave 5 vectors for 6 texts"):
        run_rounds([Short()], ["x"] * 6, 1, lambda _: None)


def test_the_batch_size_sweep_tries_each_size() -> None:
    model = FakeST()
    from ops.bench.embed import SentenceTransformersContender

    best, rates = best_batch_size(
        lambda size: SentenceTransformersContender(model, size, None), (8, 32), ["a b"] * 10, print
    )
    assert best in (8, 32) and set(rates) == {8, 32} and all(r > 0 for r in rates.values())
    assert model.batch_sizes == [8, 8, 32, 32]  # a warm-up and a timed run each


def test_agreement_finds_the_worst_row() -> None:
    a = np.eye(3, dtype=np.float32)
    b = a.copy()
    b[1] = [1, 1, 0]
    result = agreement(a, b)
    assert result["min_cosine"] == pytest.approx(2**-0.5, abs=1e-6)
    assert result["worst_text"] == 1
    assert result["mean_cosine"] == pytest.approx((2 + 2**-0.5) / 3, abs=1e-6)


@pytest.mark.parametrize("vllm_runs", [None, True, False])
def test_the_report_has_rates_ratios_agreement_and_targets(vllm_runs: bool | None) -> None:
    options = EmbedBenchOptions(texts=30, rounds=2, sample=6, batch_sizes=(4, 16), direct=True,
                                prompt_name="query")  # fmt: skip
    vllm = None if vllm_runs is None else FakeVllm(vllm_runs)
    report = measure(options, FakeEncoder(), lambda t: _tokenize("q: " + t), FakeST(), vllm, print)
    assert report["benchmark"] == "embed" and report["host"]["cpus"] >= 1
    assert report["texts"]["texts"] == 30 and report["texts"]["tokens"] > 0
    assert report["setup"]["isa"] and report["setup"]["threads"] >= 1
    assert report["st_batch_sizes"]["best"] in (4, 16)
    names = {OURS, ST, "tokenmill-direct"} | ({VLLM} if vllm_runs else set())
    assert set(report["contenders"]) == names
    for name in names:
        section = report["contenders"][name]
        assert len(section["runs"]) == 2
        assert section["texts_per_s"] >= max(r["texts_per_s"] for r in section["runs"]) * 0.999
        assert section["tokens_per_s"] > section["texts_per_s"]
        if name != OURS:
            assert section["tokenmill_ratio"] > 0
    st_agreement = report["contenders"][ST]["agreement_with_tokenmill"]
    assert 0.99 < st_agreement["min_cosine"] < 1.0  # FakeST's small error
    assert report["contenders"]["tokenmill-direct"]["agreement_with_tokenmill"]["min_cosine"] == 1.0
    targets = report["targets"]
    assert set(targets) == {
        "vs_sentence_transformers",
        "vs_vllm",
        "min_cosine_vs_sentence_transformers",
    }
    assert targets["min_cosine_vs_sentence_transformers"]["met"] is False
    assert (targets["vs_vllm"]["value"] is None) == (not vllm_runs)
    if vllm is not None:
        assert report["vllm"]["ran"] is vllm_runs
        assert vllm.calls == (3 if vllm_runs else 0)  # a warm-up and two rounds
    assert "sentence-transformers" in report.text()
