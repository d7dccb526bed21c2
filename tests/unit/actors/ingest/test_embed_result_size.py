"""The door's refusal of an embedding request whose result could not fit in one record."""

from __future__ import annotations

import base64

import msgspec
import numpy as np
import pytest

from actors.ingest.rules import check_embed_result_size
from messages.embedding import Embedding, EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest

LIMIT = 1 << 20


def _result_bytes(request: EmbedRequest, inputs: int, width: int) -> int:
    """The size of a real result of `inputs` unit vectors, as the worker encodes it."""
    rng = np.random.default_rng(0)
    data = []
    for index in range(inputs):
        vector = rng.standard_normal(request.dimensions or width).astype(np.float32)
        vector /= np.linalg.norm(vector)
        value: list[float] | str = (
            base64.b64encode(vector.astype("<f4").tobytes()).decode()
            if request.encoding_format == "base64"
            else vector.tolist()
        )
        data.append(Embedding(index=index, embedding=value))
    return len(msgspec.json.encode(EmbedResult(id=request.id, data=data)))


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_what_passes_the_door_fits_and_the_estimate_is_close(encoding_format: str) -> None:
    request = EmbedRequest(id="r", input=["x"], encoding_format=encoding_format)  # type: ignore[arg-type]
    width = 768
    accepted = 0
    for inputs in range(1, 400):
        try:
            check_embed_result_size(request, inputs, width, LIMIT)
        except InvalidRequest:
            break
        accepted = inputs
    assert accepted > 0
    real = _result_bytes(request, accepted, width)
    assert real <= LIMIT  # what the door lets in fits
    assert real >= 0.9 * LIMIT  # and the door refuses little that would have fit


def test_a_request_too_large_is_told_how_many_inputs_fit() -> None:
    request = EmbedRequest(id="r", input=["x"] * 2048)
    with pytest.raises(InvalidRequest) as caught:
        check_embed_result_size(request, 2048, 768, LIMIT)
    assert caught.value.code is ErrorCode.RESULT_TOO_LARGE
    assert "base64" in str(caught.value) and "at most" in str(caught.value)


def test_fewer_dimensions_fit_more_inputs() -> None:
    narrow = EmbedRequest(id="r", input=["x"], dimensions=128)
    check_embed_result_size(narrow, 300, 768, LIMIT)
    with pytest.raises(InvalidRequest):
        check_embed_result_size(EmbedRequest(id="r", input=["x"]), 300, 768, LIMIT)
