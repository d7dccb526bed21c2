"""The model-independent rules a decoded `GenerateRequest` must follow.

The wire's own rules (exactly one prompt, a reply topic Kafka accepts, timeout, metadata size)
are here; `max_new_tokens` and sampling come from `messages.admission`, the one table of
admission rules. The rules that need the model are checked by `actors.ingest.model_front` once
the worker knows which model will run the request: the model's name, and the table's prompt
length, `max_new_tokens` cap and vocabulary rules.
"""

from __future__ import annotations

import re

from messages.admission import check_max_new_tokens, check_sampling
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import MAX_METADATA_CHARS, MAX_METADATA_ENTRIES
from messages.request import GenerateRequest
from messages.response_format import check_response_format

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
    check_max_new_tokens(request.max_new_tokens)
    check_sampling(request)
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
    if request.stream_interval_tokens is not None and request.stream_interval_tokens < 1:
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST,
            f"stream_interval_tokens must be at least 1, got {request.stream_interval_tokens}",
        )
    if request.stream_interval_ms is not None and not request.stream_interval_ms >= 0:
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST,
            f"stream_interval_ms must be ≥ 0, got {request.stream_interval_ms}",
        )
    metadata_chars = sum(len(k) + len(v) for k, v in request.metadata.items())
    if len(request.metadata) > MAX_METADATA_ENTRIES or metadata_chars > MAX_METADATA_CHARS:
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST,
            f"metadata is limited to {MAX_METADATA_ENTRIES} entries and {MAX_METADATA_CHARS} "
            f"characters (got {len(request.metadata)} and {metadata_chars}); it is echoed back",
        )
    check_response_format(request.response_format)
