"""The checks of the ingest's door that need no model state: rules, deadline, tokens, key.

Pure functions over one request; the ingest calls them for every record it reads. `check` is
total: whatever `messages.request_decoding.decode_request` returns leads to a deadline or an
`InvalidRequest`, never another exception (`tests/unit/actors/ingest/test_door_total.py`).
"""

from __future__ import annotations

import time

from actors.ingest.model_front import ModelFront, Tokens
from messages.embedding import EmbedRequest
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import MAX_ID_BYTES
from messages.request_kinds import Request
from messages.validation import check_embed_request, check_request


def tokenize_all(front: ModelFront, requests: list[Request]) -> list[Tokens | InvalidRequest]:
    out: list[Tokens | InvalidRequest] = []
    for request in requests:
        try:
            out.append(front.tokenize(request))
        except InvalidRequest as exc:
            out.append(exc)
        except Exception as exc:  # a template or tokenizer failure is this request's problem
            out.append(InvalidRequest(ErrorCode.INVALID_PROMPT, f"cannot tokenize: {exc}"))
    return out


def check(request: Request, record_timestamp_ms: int) -> float | None:
    """Apply the model-independent rules; returns the deadline (monotonic) if it has one.
    Raises `InvalidRequest`, and nothing else, for any request `decode_request` returns."""
    if isinstance(request, EmbedRequest):
        check_embed_request(request)
    else:
        check_request(request)
    deadline = deadline_of(request, record_timestamp_ms)
    if deadline is not None and deadline <= time.monotonic():
        raise InvalidRequest(
            ErrorCode.DEADLINE_EXCEEDED, "the request's deadline passed before it was read"
        )
    return deadline


# An embedding result's bytes a vector value: float32 values written as JSON numbers take 21
# on average (the shortest text that reads back the same double, and a comma); base64, 4/3 of
# the 4 bytes. A vector's own fields and the result's (id, metadata, model, timings) are apart.
FLOAT_VALUE_BYTES = 22
BASE64_VALUE_BYTES = 16 / 3
VECTOR_OVERHEAD_BYTES = 48
RESULT_OVERHEAD_BYTES = 2048


def check_embed_result_size(request: EmbedRequest, inputs: int, width: int, max_bytes: int) -> None:
    """Refuse at the door an embedding request whose result would not fit in one record of
    `max_bytes` (`result_too_large`), rather than after its vectors are made. `width`: the
    model's full width (the request's `dimensions` when it asks fewer)."""
    dimensions = request.dimensions or width
    per_value = BASE64_VALUE_BYTES if request.encoding_format == "base64" else FLOAT_VALUE_BYTES
    per_vector = dimensions * per_value + VECTOR_OVERHEAD_BYTES
    fixed = (
        RESULT_OVERHEAD_BYTES
        + len(request.id)
        + sum(len(k) + len(v) for k, v in request.metadata.items())
    )
    size = int(inputs * per_vector + fixed)
    if size <= max_bytes:
        return
    fits = max(0, int((max_bytes - fixed) // per_vector))
    raise InvalidRequest(
        ErrorCode.RESULT_TOO_LARGE,
        f"{inputs} vectors of {dimensions} values as {request.encoding_format} make about "
        f"{size} bytes, over the worker's limit of {max_bytes} a result: send at most {fits} "
        "inputs a request, or ask encoding_format base64 or fewer dimensions",
    )


def deadline_of(request: Request, record_timestamp_ms: int) -> float | None:
    """The request's deadline on the monotonic clock: the earlier of `deadline`, `timeout_ms`.

    For a request `check_request` passed this cannot overflow: `timeout_ms` is at most
    `messages.limits.MAX_TIMEOUT_MS`, and an aware datetime's timestamp is finite for every
    year msgspec reads (1 to 9999, any offset); one that far out is as good as no deadline.
    """
    walls: list[float] = []
    if request.deadline is not None:
        walls.append(request.deadline.timestamp())
    if request.timeout_ms is not None:
        walls.append((record_timestamp_ms + request.timeout_ms) / 1000)
    if not walls:
        return None
    return time.monotonic() + (min(walls) - time.time())


def key_text(key: bytes | None) -> str:
    """The record key as the result's id, when the request has none it could use."""
    if not key or len(key) > MAX_ID_BYTES:
        return ""
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return ""
