"""OpenAI Batch lines → tokenmill messages: input line → `GenerateRequest` (the answers, result →
output line, are `messages.openai_batch_answers`).

    line = parse_line(raw_bytes)                          # or BatchLineRefused
    request = to_request(line, "batch-1f2e-7")            # or BatchLineRefused

Pure functions: no I/O, no clock except `created` stamps.

Prompt logprobs (completions' `echo` and vLLM's `prompt_logprobs`) become the request's
`prompt_logprobs` (the most alternatives either asks); what the line asked rides in the request's
metadata beside `custom_id` (`ECHO_KEY`: the line's `logprobs`, "" for none; `PROMPT_LOGPROBS_KEY`)
and comes back in the result's, so `answer_line` shapes the answer from the result alone. The
echoed text is the result's `prompt_text`: the worker decodes the prompt's tokens, so a prompt
given as token ids is echoed too.
"""

from __future__ import annotations

import enum
import re
from typing import Any, TypeVar

import msgspec

from messages.errors import BatchLineRefused, InvalidRequest
from messages.openai_batch import (
    CHAT_COMPLETIONS_URL,
    COMPLETIONS_URL,
    SUPPORTED_URLS,
    BatchInputLine,
    ChatCompletionBody,
    CompletionBody,
)
from messages.openai_chat_tools import chat_message, with_tools
from messages.openai_guided import constraint_fields
from messages.request import GenerateRequest
from messages.validation import check_request


class LineCode(enum.StrEnum):
    """Why an input line never became a request (beside `ErrorCode`s of request rules)."""

    INVALID_JSON = "invalid_json"
    MISSING_CUSTOM_ID = "missing_custom_id"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    UNSUPPORTED_METHOD = "unsupported_method"
    UNSUPPORTED_URL = "unsupported_url"
    INVALID_BODY = "invalid_body"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"


# Body fields tokenmill does not use that cannot change the answer: accepted and ignored.
HARMLESS = frozenset(
    {
        "user", "store", "metadata", "stream_options", "service_tier",
        "parallel_tool_calls", "prompt_cache_key",
        "safety_identifier", "reasoning_effort",
    }
)  # fmt: skip

_Body = TypeVar("_Body", CompletionBody, ChatCompletionBody)
_PATH = re.compile(r"(?:at `\$\.|missing required field `)([A-Za-z_]+)")
_TOKEN_ID = re.compile(r"-?[0-9]{1,20}")  # out-of-range ids are refused with the request
# The request metadata a line's prompt-logprob asks ride in (see the module's docstring).
ECHO_KEY = "openai.echo"
PROMPT_LOGPROBS_KEY = "openai.prompt_logprobs"
# vLLM's `request_id` (the answer's `id` is made of it) and `return_tokens_as_token_ids` ("1").
REQUEST_ID_KEY = "openai.request_id"
TOKENS_AS_IDS_KEY = "openai.tokens_as_ids"
# An omitted `max_tokens` the worker fills (`model_defaults`) still carries a value: the one an
# older worker, which knows no `model_defaults`, runs (the wire's default).
_WIRE_MAX_TOKENS = 16
_json_decoder = msgspec.json.Decoder()


def parse_line(raw: bytes) -> BatchInputLine:
    """Read one input line's envelope; raise `BatchLineRefused` saying what is wrong with it."""
    try:
        obj = _json_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise BatchLineRefused(LineCode.INVALID_JSON, f"not JSON: {exc}") from None
    except RecursionError:
        raise BatchLineRefused(LineCode.INVALID_JSON, "nested too deeply") from None
    if not isinstance(obj, dict):
        raise BatchLineRefused(LineCode.INVALID_JSON, "a line must be a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BatchLineRefused(
            LineCode.MISSING_CUSTOM_ID, "`custom_id` must be a non-empty string", param="custom_id"
        )
    method, url, body = obj.get("method", "POST"), obj.get("url"), obj.get("body")
    if method != "POST":
        raise BatchLineRefused(
            LineCode.UNSUPPORTED_METHOD,
            f"method {method!r}: only POST is supported",
            param="method",
            custom_id=custom_id,
        )
    if url not in SUPPORTED_URLS:
        raise BatchLineRefused(
            LineCode.UNSUPPORTED_URL,
            f"url {url!r}: supported are {', '.join(SUPPORTED_URLS)}",
            param="url",
            custom_id=custom_id,
        )
    if not isinstance(body, dict):
        raise BatchLineRefused(
            LineCode.INVALID_BODY, "`body` must be a JSON object", param="body", custom_id=custom_id
        )
    return BatchInputLine(custom_id=custom_id, method=method, url=url, body=body)


def to_request(
    line: BatchInputLine,
    request_id: str,
    *,
    model: str | None = None,
    default_max_tokens: int | None = None,
    openai_defaults: bool = False,
    ignore_unknown: bool = False,
) -> GenerateRequest:
    """The `GenerateRequest` for `line`'s body, checked against the model-independent rules.

    `model` overrides the body's model. An omitted `max_tokens` is `default_max_tokens` when
    given; otherwise the wire default, 16 (OpenAI's for completions), or with
    `openai_defaults` a chat runs to EOS or the worker's limits. With `openai_defaults` an
    omitted `temperature`, `top_p` and `top_k` take the model's recommended values, else
    OpenAI's (both filled by the worker: `GenerateRequest.model_defaults`); without it they are
    the wire's (greedy). `ignore_unknown`: a body field the mapper does not know is left out
    (`unknown_fields` names them) instead of refused. The request's metadata carries the
    `custom_id`, so every result names the line it answers.
    """
    try:
        fields = _request_fields(line, ignore_unknown)
    except BatchLineRefused as exc:
        exc.custom_id = line.custom_id
        raise
    fields["id"] = request_id
    fields["metadata"] = {"custom_id": line.custom_id, **fields.get("metadata", {})}
    if model is not None:
        fields["model"] = model
    if openai_defaults:
        fields["model_defaults"] = [
            name for name in ("temperature", "top_p", "top_k") if name not in fields
        ]
    if fields.get("max_new_tokens") is None:
        fields.pop("max_new_tokens", None)
        if default_max_tokens is not None:
            fields["max_new_tokens"] = default_max_tokens
        elif openai_defaults and line.url == CHAT_COMPLETIONS_URL:
            fields["model_defaults"].insert(0, "max_new_tokens")
            fields["max_new_tokens"] = max(_WIRE_MAX_TOKENS, fields.get("min_tokens", 0))
    request = GenerateRequest(**fields)
    try:
        check_request(request)
    except InvalidRequest as exc:
        raise BatchLineRefused(exc.code, exc.message, custom_id=line.custom_id) from None
    return request


def unknown_fields(line: BatchInputLine) -> tuple[str, ...]:
    """The fields of `line`'s body the mapper does not know (`HARMLESS` ones and nulls aside):
    those `to_request` refuses, or leaves out with `ignore_unknown`."""
    kind = ChatCompletionBody if line.url == CHAT_COMPLETIONS_URL else CompletionBody
    return tuple(
        name
        for name, value in line.body.items()
        if value is not None and name not in kind.__struct_fields__ and name not in HARMLESS
    )


def _request_fields(line: BatchInputLine, ignore_unknown: bool = False) -> dict[str, Any]:
    if line.url == COMPLETIONS_URL:
        completion = _convert(line, CompletionBody, ignore_unknown)
        _refuse_unsupported(completion)
        if completion.best_of is not None and completion.best_of != (completion.n or 1):
            raise BatchLineRefused(
                LineCode.UNSUPPORTED_PARAMETER,
                "`best_of` must equal `n` (ranking more candidates than are returned is not "
                "supported)",
                param="best_of",
            )
        _refuse_if(completion.suffix is not None, "suffix")
        fields = {**_sampling(completion, completion.max_tokens), **_prompt(completion.prompt)}
        fields |= constraint_fields(completion)
        if completion.logprobs is not None:
            fields["logprobs"] = completion.logprobs  # its range is checked with the request
        return _with(fields, _prompt_logprobs_fields(completion))
    assert line.url == CHAT_COMPLETIONS_URL
    chat = _convert(line, ChatCompletionBody, ignore_unknown)
    _refuse_unsupported(chat)
    if chat.top_logprobs and not chat.logprobs:
        raise BatchLineRefused(
            LineCode.INVALID_BODY, "`top_logprobs` needs `logprobs: true`", param="top_logprobs"
        )
    if not chat.messages:
        raise BatchLineRefused(LineCode.INVALID_BODY, "`messages` is empty", param="messages")
    max_tokens = (
        chat.max_tokens if chat.max_completion_tokens is None else chat.max_completion_tokens
    )
    messages = [chat_message(m) for m in chat.messages]
    fields = {**_sampling(chat, max_tokens), "messages": messages}
    if chat.logprobs:
        fields["logprobs"] = chat.top_logprobs or 0  # its range is checked with the request
    return with_tools(chat, fields | _template_fields(chat))


def _template_fields(chat: ChatCompletionBody) -> dict[str, Any]:
    """vLLM's chat template extras, as the request carries them (checked with it)."""
    fields: dict[str, Any] = {}
    if chat.chat_template_kwargs:
        fields["chat_template_kwargs"] = chat.chat_template_kwargs
    if chat.continue_final_message:
        fields["continue_final_message"] = True
        fields["add_generation_prompt"] = False  # vLLM's: the last message is continued
    if chat.add_generation_prompt is not None:
        fields["add_generation_prompt"] = chat.add_generation_prompt
    return fields


def _with(fields: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`fields` updated with `more`, their metadata merged."""
    metadata = {**fields.get("metadata", {}), **more.get("metadata", {})}
    merged = fields | more
    if metadata:
        merged["metadata"] = metadata
    return merged


def _prompt_logprobs_fields(completion: CompletionBody) -> dict[str, Any]:
    """The request's `prompt_logprobs` for `echo` and vLLM's `prompt_logprobs`, and the
    metadata saying what the answer shows (ranges are checked with the request)."""
    echo, asked = bool(completion.echo), completion.prompt_logprobs
    if not echo and asked is None:
        return {}
    metadata = {}
    ks = [asked or 0]
    if echo:  # the prompt's text at least; its logprobs with the line's `logprobs`
        metadata[ECHO_KEY] = "" if completion.logprobs is None else str(completion.logprobs)
        ks.append(completion.logprobs or 0)
    if asked is not None:
        metadata[PROMPT_LOGPROBS_KEY] = str(asked)
    return {
        "prompt_logprobs": asked if asked is not None and asked < 0 else max(ks),
        "metadata": metadata,
    }


def _convert(line: BatchInputLine, kind: type[_Body], ignore_unknown: bool) -> _Body:
    try:
        converted = msgspec.convert(line.body, kind)
    except msgspec.ValidationError as exc:
        found = _PATH.search(str(exc))
        raise BatchLineRefused(
            LineCode.INVALID_BODY, f"body: {exc}", param=found.group(1) if found else None
        ) from None
    except RecursionError:
        raise BatchLineRefused(LineCode.INVALID_BODY, "body: nested too deeply") from None
    if not ignore_unknown and (unknown := unknown_fields(line)):
        name = unknown[0]
        raise BatchLineRefused(
            LineCode.UNSUPPORTED_PARAMETER, f"`{name}` is not supported", param=name
        )
    return converted


def _refuse_if(condition: bool, param: str) -> None:
    if condition:
        raise BatchLineRefused(
            LineCode.UNSUPPORTED_PARAMETER, f"`{param}` is not supported", param=param
        )


def _refuse_unsupported(body: CompletionBody | ChatCompletionBody) -> None:
    _refuse_if(bool(body.stream), "stream")


def _sampling(body: CompletionBody | ChatCompletionBody, max_tokens: int | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": body.model, "max_new_tokens": max_tokens}
    if body.temperature is not None:
        fields["temperature"] = body.temperature
    if body.top_p is not None:
        fields["top_p"] = body.top_p
    if body.top_k is not None:
        fields["top_k"] = max(body.top_k, 0)  # vLLM's -1 means "off", as tokenmill's 0
    if body.seed is not None:
        fields["seed"] = body.seed
    if body.n is not None:
        fields["n"] = body.n  # checked with the request (`messages.admission.check_choices`)
    if body.stop is not None:
        fields["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    if body.stop_token_ids is not None:
        fields["stop_token_ids"] = body.stop_token_ids
    # Penalties and biases: their ranges are checked with the request's other sampling rules.
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"):
        if (value := getattr(body, name)) is not None:
            fields[name] = value
    if body.min_tokens is not None:
        fields["min_tokens"] = body.min_tokens
    if body.logit_bias:
        fields["logit_bias"] = _logit_bias(body.logit_bias)
    if body.speculate is not None:
        fields["speculate"] = body.speculate
    return fields | _vllm_fields(body)


def _vllm_fields(body: CompletionBody | ChatCompletionBody) -> dict[str, Any]:
    """vLLM's output and scheduling extras; what only the answer needs rides in metadata."""
    fields: dict[str, Any] = {}
    for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
        if (value := getattr(body, name)) is not None:
            fields[name] = value
    if body.truncate_prompt_tokens is not None:
        fields["truncate_prompt_tokens"] = body.truncate_prompt_tokens  # checked with the request
    if body.priority is not None:
        fields["priority"] = -body.priority  # vLLM's lower-first; the wire's larger-first
    metadata = {}
    if body.request_id:
        metadata[REQUEST_ID_KEY] = body.request_id
    if body.return_tokens_as_token_ids:
        metadata[TOKENS_AS_IDS_KEY] = "1"
    if metadata:
        fields["metadata"] = metadata
    return fields


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's `logit_bias`, whose keys are token ids written as strings, by token id."""
    wrong = next((key for key in bias if not _TOKEN_ID.fullmatch(key)), None)
    if wrong is not None:
        raise BatchLineRefused(
            LineCode.INVALID_BODY,
            f"logit_bias keys must be token ids (decimal integers), got {wrong[:40]!r}",
            param="logit_bias",
        )
    return {int(key): value for key, value in bias.items()}


def _prompt(prompt: str | list[int | str]) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if prompt and all(isinstance(p, int) for p in prompt):
        return {"prompt_token_ids": prompt}
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return {"prompt": prompt[0]}
    raise BatchLineRefused(
        LineCode.INVALID_BODY,
        "`prompt` must be a string or a list of token ids (one prompt per line)",
        param="prompt",
    )


def calls_tool(line: BatchInputLine) -> bool:
    """Whether `line` (one `to_request` took) gives tools the model may call: its answer is
    read for calls (`answer_line`'s `tool_call`; how, the request's metadata says:
    `TOOLS_KEY`)."""
    tools = line.body.get("tools") or line.body.get("functions")
    choice = line.body.get("tool_choice", line.body.get("function_call"))
    return line.url == CHAT_COMPLETIONS_URL and bool(tools) and choice != "none"
