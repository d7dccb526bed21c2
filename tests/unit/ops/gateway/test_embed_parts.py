"""The gateway's parts of a large embedding request, and their results joined back."""

from __future__ import annotations

import base64

import numpy as np

from messages.embedding import Embedding, EmbedRequest, EmbedResult, EmbedUsage
from messages.error_codes import ErrorCode
from messages.result import ErrorInfo, ModelRef
from ops.gateway.embed_parts import PART_INPUTS, joined, split


def _answer(part: EmbedRequest, rng: np.random.Generator) -> tuple[EmbedResult, list[np.ndarray]]:
    """What a worker answers `part` (base64 vectors), and the vectors themselves."""
    assert isinstance(part.input, list)
    vectors = [rng.standard_normal(8).astype(np.float32) for _ in part.input]
    data = [
        Embedding(index=i, embedding=base64.b64encode(v.astype("<f4").tobytes()).decode())
        for i, v in enumerate(vectors)
    ]
    result = EmbedResult(
        id=part.id,
        data=data,
        dimensions=8,
        usage=EmbedUsage(prompt_tokens=3 * len(vectors), total_tokens=3 * len(vectors)),
        model=ModelRef(name="m", digest="d", task="embed"),
        worker="w1",
    )
    return result, vectors


def test_a_small_request_is_one_part_asked_in_base64() -> None:
    request = EmbedRequest(id="r.1", input=["a", "b"], metadata={"k": "v"})
    (part,) = split(request)
    assert part.id == "r.1" and part.input == ["a", "b"] and part.encoding_format == "base64"


def test_a_large_request_is_cut_in_order_and_joined_back_as_asked() -> None:
    texts = [f"text {i}" for i in range(2 * PART_INPUTS + 5)]
    request = EmbedRequest(id="r", input=texts, metadata={"custom_id": "c"})
    parts = split(request)
    assert [p.id for p in parts] == ["r.0", "r.1", "r.2"]
    assert [t for p in parts for t in p.input or []] == texts  # type: ignore[union-attr]
    rng = np.random.default_rng(0)
    answered = [_answer(p, rng) for p in parts]
    result = joined(request, [r for r, _ in answered])
    expected = [v for _, vectors in answered for v in vectors]
    assert result.id == "r" and result.metadata == {"custom_id": "c"}
    assert [e.index for e in result.data] == list(range(len(texts)))
    for e, v in zip(result.data, expected, strict=True):
        assert e.embedding == v.tolist()  # floats, as asked: the same float32 values
    assert result.usage.prompt_tokens == 3 * len(texts)


def test_base64_asked_stays_base64_and_token_id_inputs_split_too() -> None:
    request = EmbedRequest(id="r", input=[[1, 2]] * (PART_INPUTS + 1), encoding_format="base64")
    parts = split(request)
    assert len(parts) == 2 and parts[1].input == [[1, 2]]
    rng = np.random.default_rng(1)
    result = joined(request, [_answer(p, rng)[0] for p in parts])
    assert all(isinstance(e.embedding, str) for e in result.data)


def test_a_failed_part_fails_the_request_with_its_error() -> None:
    request = EmbedRequest(id="r", input=["x"] * (PART_INPUTS + 1))
    parts = split(request)
    ok, _ = _answer(parts[0], np.random.default_rng(2))
    failed = EmbedResult(
        id=parts[1].id, error=ErrorInfo(code=ErrorCode.PROMPT_TOO_LONG, message="too long")
    )
    result = joined(request, [ok, failed])
    assert result.id == "r" and result.data == []
    assert result.error is not None and result.error.code is ErrorCode.PROMPT_TOO_LONG
