"""The model-independent rules a decoded `GenerateRequest` (or `EmbedRequest`) must follow.

The wire's own rules (exactly one prompt, a reply topic Kafka accepts, metadata size, the
range of every number, from `messages.limits`) are here; `max_new_tokens`, token ids and
sampling come from `messages.admission`, the one table of admission rules. The rules that need
the model are checked by `actors.ingest.model_front` once the worker knows which model will
run the request: the model's name, and the table's prompt length, `max_new_tokens` cap and
vocabulary rules.
"""

from __future__ import annotations

import re
from typing import cast

from messages.admission import (
    check_choices,
    check_logprobs,
    check_max_new_tokens,
    check_sampling,
    check_token_ids,
)
from messages.embedding import EmbedInput, EmbedRequest
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import (
    INT64_LIMIT,
    MAX_EMBED_INPUTS,
    MAX_METADATA_CHARS,
    MAX_METADATA_ENTRIES,
    MAX_PRIORITY,
    MAX_STREAM_INTERVAL_MS,
    MAX_STREAM_INTERVAL_TOKENS,
    MAX_TIMEOUT_MS,
    MIN_PRIORITY,
    MIN_SCHEMA_VERSION,
    number_text,
)
from messages.openai_tools import check_tool_calling
from messages.request import MODEL_DEFAULTS, GenerateRequest
from messages.response_format import check_response_format
from messages.structured_output import check_structured_output

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def is_topic_name(name: str) -> bool:
    """Whether Kafka accepts `name` as a topic name."""
    return bool(_TOPIC_NAME.fullmatch(name)) and name not in (".", "..")


def check_request(request: GenerateRequest) -> None:
    """Raise `InvalidRequest` with the code of the first rule `request` breaks.

    Total over whatever `decode_request` returns: any request raises `InvalidRequest` or
    nothing. The ranges of `messages.limits` are checked here (`INVALID_REQUEST` unless the
    field has its own code).
    """
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
    if request.prompt_token_ids is not None:
        check_token_ids(request.prompt_token_ids, "prompt_token_ids")
    check_max_new_tokens(request.max_new_tokens, scoring=request.prompt_logprobs is not None)
    check_sampling(request)
    check_logprobs(request.logprobs)
    check_logprobs(request.prompt_logprobs, "prompt_logprobs")
    check_choices(request.n)
    check_common(request)
    check_response_format(request.response_format)
    check_structured_output(request.structured_output, request.response_format)
    shape = request.response_format
    check_tool_calling(
        request.tools,
        request.tool_calling is not None,
        with_messages=request.messages is not None,
        constrained=request.structured_output is not None or bool(shape and shape.constrained),
    )
    _check_extras(request)


def check_common(request: GenerateRequest | EmbedRequest) -> None:
    """The rules both kinds of request follow: reply topic, timeout, priority, schema version,
    metadata size (and a generation request's chunk intervals, in between). Raises
    `InvalidRequest`."""
    if request.reply_to is not None and not is_topic_name(request.reply_to):
        raise InvalidRequest(
            ErrorCode.INVALID_REPLY_TO,
            f"reply_to {request.reply_to!r} is not a Kafka topic name "
            "(1-249 of a-z, A-Z, 0-9, '.', '_', '-'; not '.' or '..')",
        )
    timeout_ms = request.timeout_ms
    if timeout_ms is not None and timeout_ms <= 0:
        raise _invalid(f"timeout_ms must be positive, got {number_text(timeout_ms)}")
    if timeout_ms is not None and timeout_ms > MAX_TIMEOUT_MS:
        raise _invalid(
            f"timeout_ms must be at most {MAX_TIMEOUT_MS} (a week), got {number_text(timeout_ms)}"
        )
    if isinstance(request, GenerateRequest):
        _check_intervals(request)
    if not MIN_PRIORITY <= request.priority <= MAX_PRIORITY:
        raise _invalid(
            f"priority must be in [{MIN_PRIORITY}, {MAX_PRIORITY}] (waiting raises it one level "
            f"per aging period), got {number_text(request.priority)}"
        )
    if not MIN_SCHEMA_VERSION <= request.v < INT64_LIMIT:
        raise _invalid(
            f"v (the schema version) must be in [0, 2**63), got {number_text(request.v)}"
        )
    metadata_chars = sum(len(k) + len(v) for k, v in request.metadata.items())
    if len(request.metadata) > MAX_METADATA_ENTRIES or metadata_chars > MAX_METADATA_CHARS:
        raise _invalid(
            f"metadata is limited to {MAX_METADATA_ENTRIES} entries and {MAX_METADATA_CHARS} "
            f"characters (got {len(request.metadata)} and {metadata_chars}); it is echoed back",
        )


def _check_intervals(request: GenerateRequest) -> None:
    tokens = request.stream_interval_tokens
    if tokens is not None and not 1 <= tokens <= MAX_STREAM_INTERVAL_TOKENS:
        raise _invalid(
            f"stream_interval_tokens must be in [1, {MAX_STREAM_INTERVAL_TOKENS}], "
            f"got {number_text(tokens)}"
        )
    ms = request.stream_interval_ms
    if ms is not None and not 0 <= ms <= MAX_STREAM_INTERVAL_MS:  # also refuses NaN
        raise _invalid(f"stream_interval_ms must be in [0, {MAX_STREAM_INTERVAL_MS:.0f}], got {ms}")


def check_embed_request(request: EmbedRequest) -> None:
    """Raise `InvalidRequest` with the code of the first model-independent rule `request`
    breaks: its inputs (one kind, none empty, at most `MAX_EMBED_INPUTS`, token ids in range),
    `dimensions` positive, and the rules every request follows (`check_common`). The model's
    own (its width, prompts, vocabulary, length) are `actors.ingest.model_front`'s."""
    inputs = embed_inputs(request.input)
    if len(inputs) > MAX_EMBED_INPUTS:
        raise InvalidRequest(
            ErrorCode.INVALID_PROMPT,
            f"`input` holds {len(inputs)} inputs; the limit is {MAX_EMBED_INPUTS}",
        )
    for index, one in enumerate(inputs):
        if not one:
            raise InvalidRequest(ErrorCode.EMPTY_PROMPT, f"input {index} is empty")
        if not isinstance(one, str):
            check_token_ids(one, f"input {index}")
    dimensions = request.dimensions
    if dimensions is not None and dimensions < 1:
        raise InvalidRequest(
            ErrorCode.INVALID_DIMENSIONS,
            f"dimensions must be positive, got {number_text(dimensions)}",
        )
    check_common(request)


def embed_inputs(value: EmbedInput | None) -> list[str | list[int]]:
    """An `EmbedRequest.input` as its list of inputs, each a text or a list of token ids:
    "a" → ["a"]; [1, 2] → [[1, 2]]. Raises `InvalidRequest`: `invalid_prompt` when there is
    none or its kinds are mixed, `empty_prompt` when it is an empty list."""
    if value is None:
        raise InvalidRequest(ErrorCode.INVALID_PROMPT, "an embedding request needs `input`")
    if isinstance(value, str):
        return [value]
    if not value:
        raise InvalidRequest(ErrorCode.EMPTY_PROMPT, "`input` is an empty list")
    if all(isinstance(one, int) for one in value):
        return [cast(list[int], value)]
    if all(isinstance(one, str) for one in value) or all(isinstance(one, list) for one in value):
        return cast(list[str | list[int]], value)
    raise InvalidRequest(
        ErrorCode.INVALID_PROMPT,
        "`input` mixes kinds: give texts, or token ids, or lists of token ids, not several",
    )


def _check_extras(request: GenerateRequest) -> None:
    """`model_defaults` names only what a worker fills; `truncate_prompt_tokens` is a count
    (or -1); an open final message gets no generation prompt."""
    unknown = sorted(set(request.model_defaults) - set(MODEL_DEFAULTS))
    if unknown:
        raise _invalid(
            f"model_defaults may name {', '.join(MODEL_DEFAULTS)}; got {', '.join(unknown)}"
        )
    k = request.truncate_prompt_tokens
    if k is not None and not (k == -1 or 1 <= k < INT64_LIMIT):
        raise _invalid(
            "truncate_prompt_tokens must be positive (keep that many last prompt tokens) or -1 "
            f"(as many as the model takes), got {number_text(k)}"
        )
    if request.continue_final_message and request.add_generation_prompt:
        raise _invalid(
            "continue_final_message continues the last message: set add_generation_prompt "
            "false with it"
        )


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(ErrorCode.INVALID_REQUEST, message)
