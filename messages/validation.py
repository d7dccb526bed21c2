"""The model-independent rules a decoded `GenerateRequest` must follow.

Limits that depend on the model (prompt length, vocabulary, `max_new_tokens` cap, model name)
are checked by the worker once it knows which model will run the request.
"""

from __future__ import annotations

import math
import re

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import (
    MAX_METADATA_CHARS,
    MAX_METADATA_ENTRIES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
)
from messages.request import GenerateRequest

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def is_topic_name(name: str) -> bool:
    """Whether Kafka accepts `name` as a topic name."""
    return bool(_TOPIC_NAME.fullmatch(name)) and name not in (".", "..")


def check_request(request: GenerateRequest) -> None:
    """Raise `InvalidRequest` with the code of the first rule `request` breaks."""
    given = [
        name
        for name, value in (
            ("prompt", request.prompt),
            ("prompt_token_ids", request.prompt_token_ids),
            ("messages", request.messages),
        )
        if value is not None
    ]
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise InvalidRequest(
            ErrorCode.INVALID_PROMPT,
            f"give exactly one of prompt, prompt_token_ids, messages (found: {found})",
        )
    if not (request.prompt or request.prompt_token_ids or request.messages):
        raise InvalidRequest(ErrorCode.EMPTY_PROMPT, f"`{given[0]}` is empty")
    if request.max_new_tokens <= 0:
        raise InvalidRequest(
            ErrorCode.INVALID_MAX_TOKENS,
            f"max_new_tokens must be positive, got {request.max_new_tokens}",
        )
    _check_sampling(request)
    if request.reply_to is not None and not is_topic_name(request.reply_to):
        raise InvalidRequest(
            ErrorCode.INVALID_REPLY_TO,
            f"reply_to {request.reply_to!r} is not a Kafka topic name "
            "(1-249 of a-z, A-Z, 0-9, '.', '_', '-'; not '.' or '..')",
        )
    if request.timeout_ms is not None and request.timeout_ms <= 0:
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST, f"timeout_ms must be positive, got {request.timeout_ms}"
        )
    metadata_chars = sum(len(k) + len(v) for k, v in request.metadata.items())
    if len(request.metadata) > MAX_METADATA_ENTRIES or metadata_chars > MAX_METADATA_CHARS:
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST,
            f"metadata is limited to {MAX_METADATA_ENTRIES} entries and {MAX_METADATA_CHARS} "
            f"characters (got {len(request.metadata)} and {metadata_chars}); it is echoed back",
        )


def _check_sampling(request: GenerateRequest) -> None:
    def bad(message: str) -> InvalidRequest:
        return InvalidRequest(ErrorCode.INVALID_SAMPLING_PARAMS, message)

    if not math.isfinite(request.temperature) or request.temperature < 0:
        raise bad(f"temperature must be a finite number ≥ 0, got {request.temperature}")
    if not 0 < request.top_p <= 1:  # also refuses NaN
        raise bad(f"top_p must be in (0, 1], got {request.top_p}")
    if request.top_k < 0:
        raise bad(f"top_k must be ≥ 0, got {request.top_k}")
    if any(not s for s in request.stop):
        raise bad("stop strings must not be empty")
    if len(request.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in request.stop):
        raise bad(f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} chars")
    if len(request.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise bad(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids")
    if request.seed is not None and not 0 <= request.seed < 2**63:
        raise bad(f"seed must be in [0, 2**63), got {request.seed}")
