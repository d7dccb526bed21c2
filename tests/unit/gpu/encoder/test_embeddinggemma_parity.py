"""EmbeddingGemma-300M: tokenmill's vectors against sentence-transformers' on the same folder,
both float32 on the CPU: cosine ≥ 0.9999 on a short text, unicode, code, a text longer than the
sliding window (over 512 tokens: the window on both sides matters) and one longer than the
model takes (over 2048 tokens: truncated as sentence-transformers truncates); with the query and
document prompts, with and without Matryoshka dimensions; batched in one step and alone.

The model is loaded once per module (1.2 GB each side) and the real forwards are kept few."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu.encoder import EncoderEngine, load_encoder_engine
from gpu.encoder.inputs import embed_tokens, fit
from gpu.engine_config import EngineConfig

pytestmark = [pytest.mark.slow, pytest.mark.model]

MIN_COSINE = 0.9999
SHORT = "What is the capital of France?"
UNICODE = "Ünïcödé: 東京は日本の首都です。 Привет, мир! 🚀 naïve café — «guillemets»"
CODE = (
    "def fib(n: int) -> int:\n"
    '    """The n-th Fibonacci number."""\n'
    "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
)
PARAGRAPH = (
    "Stream processing turns every event on a topic into work: a document is embedded, a "
    "ticket is classified, a product description is summarised, and the results flow to the "
    "next topic for search and retrieval. "
)
LONG = PARAGRAPH * 20  # ~700 tokens: past the 512-token window
TRUNCATED = PARAGRAPH * 70  # ~2500 tokens: cut to 2048
TEXTS = [SHORT, UNICODE, CODE, LONG, TRUNCATED]


@pytest.fixture(scope="module")
def engine(embeddinggemma_dir: Path) -> EncoderEngine:
    # a budget above the longest input: the five texts run in one step
    return load_encoder_engine(embeddinggemma_dir, config=EngineConfig(max_num_batched_tokens=8192))


@pytest.fixture(scope="module")
def reference(embeddinggemma_dir: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embeddinggemma_dir), device="cpu")


@pytest.fixture(scope="module")
def theirs(reference: Any) -> dict[str, np.ndarray]:
    return {name: reference.encode(TEXTS, prompt_name=name) for name in ("query", "document")}


def tokens(engine: EncoderEngine, text: str, prompt_name: str) -> list[int]:
    spec = engine.embedding
    cut, _ = fit(
        embed_tokens(engine.model.tokenizer, spec, text, prompt_name), spec.max_tokens, "end"
    )
    return cut


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def test_the_texts_cover_the_window_and_truncation(engine: EncoderEngine) -> None:
    spec = engine.embedding
    raw = [len(embed_tokens(engine.model.tokenizer, spec, t, "query")) for t in TEXTS]
    assert 512 < raw[3] < spec.max_tokens == 2048 < raw[4]
    assert len(tokens(engine, TRUNCATED, "query")) == 2048


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_batched_in_one_step(
    engine: EncoderEngine, theirs: dict[str, np.ndarray], prompt_name: str
) -> None:
    ours = engine.encode([tokens(engine, t, prompt_name) for t in TEXTS])
    got = [cosine(a, b) for a, b in zip(ours, theirs[prompt_name], strict=True)]
    assert min(got) >= MIN_COSINE, got


def test_alone(engine: EncoderEngine, theirs: dict[str, np.ndarray]) -> None:
    for index in (0, 3):  # a short text, one past the window
        (ours,) = engine.encode([tokens(engine, TEXTS[index], "query")])
        assert cosine(ours, theirs["query"][index]) >= MIN_COSINE


def test_matryoshka_dimensions(engine: EncoderEngine, reference: Any) -> None:
    texts = TEXTS[:3]
    cut = reference.encode(texts, prompt_name="document", truncate_dim=256)
    ours = engine.encode([tokens(engine, t, "document") for t in texts], dimensions=256)
    assert all(v.shape == (256,) and abs(np.linalg.norm(v) - 1) < 1e-5 for v in ours)
    got = [cosine(a, b) for a, b in zip(ours, cut, strict=True)]
    assert min(got) >= MIN_COSINE, got
