"""tokenmill results → OpenAI Batch output lines (and the HTTP gateway's answers).

    out = answer_line(line.custom_id, line.url, result)   # a BatchOutputLine
                                                          # (an EmbedResult: an embeddings list)
    out = refusal_line(refused, line_number=7)            # a BatchOutputLine with `error`

The other half of `messages.openai_batch_mapping` (input line → `GenerateRequest`): what a
line asked that only its answer's shape shows (echo, vLLM's prompt logprobs) comes back in the
result's metadata (`ECHO_KEY`, `PROMPT_LOGPROBS_KEY`), so an answer is shaped from its result
alone. Pure functions: no I/O, no clock except `created` stamps.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from messages.embedding import EmbedResult
from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import (
    CHAT_COMPLETIONS_URL,
    AssistantMessage,
    BatchOutputLine,
    BatchResponse,
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatTokenLogprob,
    ChoiceNote,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionTokensDetails,
    ErrorBody,
    ErrorObject,
    LineError,
    PromptLogprob,
    PromptTokensDetails,
    TokenUsage,
    TopLogprob,
)
from messages.openai_batch_mapping import (
    ECHO_KEY,
    PROMPT_LOGPROBS_KEY,
    REQUEST_ID_KEY,
    TOKENS_AS_IDS_KEY,
)
from messages.openai_chat_tools import FUNCTIONS_SUFFIX, TOOLS_KEY
from messages.openai_embeddings import embedding_list
from messages.openai_token_ids import tokens_as_ids
from messages.openai_tools import ToolCall, parse_tool_call
from messages.result import Choice, FinishReason, GenerateResult, TokenLogprobs
from messages.tool_parsing import parse_calls

# The HTTP status OpenAI would answer with for each worker-side refusal; 400 otherwise.
_STATUS = {
    ErrorCode.UNKNOWN_MODEL: 404,
    ErrorCode.DEADLINE_EXCEEDED: 408,
    ErrorCode.DUPLICATE_REQUEST: 409,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.ENGINE_ERROR: 500,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.CANCELLED: 499,  # an embedding request cancelled: nginx's "client closed request"
}


def answer_line(
    custom_id: str,
    url: str,
    result: GenerateResult | EmbedResult,
    *,
    created: int | None = None,
    tool_call: bool = False,
) -> BatchOutputLine:
    """The output line for `result`: 200 with a (chat) completion object (an `EmbedResult`:
    OpenAI's embeddings list, `messages.openai_embeddings`), or the refusal.
    `tool_call`: the request gave tools (`calls_tool`): its output is read for calls as the
    request's metadata says (`TOOLS_KEY`; "required" when it says nothing): a forced call's
    JSON, or (tool_choice "auto") calls in the model's format (`result.model.tool_format`,
    `messages.tool_parsing`). Whole calls are given as the choice's `tool_calls`
    (`finish_reason` "tool_calls"; the legacy `function_call` and "function_call" when asked
    with `functions`), with the text before them as `content`; a cut-off call is text."""
    return BatchOutputLine(
        id=f"batch_req_{uuid.uuid4().hex}",
        custom_id=custom_id,
        response=BatchResponse(
            status_code=_STATUS.get(result.error.code, 400) if result.error else 200,
            request_id=result.id,
            body=_body(url, result, int(time.time()) if created is None else created, tool_call),
        ),
    )


def _body(
    url: str, result: GenerateResult | EmbedResult, created: int, tool_call: bool = False
) -> Any:
    if result.error is not None:
        status = _STATUS.get(result.error.code, 400)
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return ErrorBody(
            error=ErrorObject(message=result.error.message, type=kind, code=result.error.code)
        )
    if isinstance(result, EmbedResult):
        return embedding_list(result)
    if TOKENS_AS_IDS_KEY in result.metadata:
        result = tokens_as_ids(result)
    answer_id = result.metadata.get(REQUEST_ID_KEY, result.id)  # vLLM's `request_id` names it
    model = result.model.name if result.model else ""
    usage = token_usage(result)
    choices = result_choices(result)
    if url == CHAT_COMPLETIONS_URL:
        return ChatCompletion(
            id=f"chatcmpl-{answer_id}",
            created=created,
            model=model,
            choices=[
                _chat_choice(c, _tool_reading(result) if tool_call else None) for c in choices
            ],
            usage=usage,
        )
    return Completion(
        id=f"cmpl-{answer_id}",
        created=created,
        model=model,
        choices=[_completion_choice(c, result) for c in choices],
        usage=usage,
    )


def result_choices(result: GenerateResult) -> list[Choice]:
    """`result`'s choices: with `n` > 1 every choice; else the result is its one choice."""
    return result.choices or [
        Choice(
            index=0,
            text=result.text,
            token_ids=result.token_ids,
            finish_reason=result.finish_reason,
            logprobs=result.logprobs,
        )
    ]


def token_usage(result: GenerateResult) -> TokenUsage:
    """`result`'s usage in OpenAI's shape (the batch line's, the HTTP answer's and the last
    streamed event's): prefix-cache hits as `prompt_tokens_details.cached_tokens`, speculative
    decoding's accepted and rejected guesses as `completion_tokens_details`'
    `accepted_prediction_tokens` and `rejected_prediction_tokens`."""
    usage = result.usage
    return TokenUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        completion_tokens_details=CompletionTokensDetails(
            accepted_prediction_tokens=usage.accepted_draft_tokens,
            rejected_prediction_tokens=usage.rejected_draft_tokens,
        ),
    )


def _tool_reading(result: GenerateResult) -> tuple[str, str, bool]:
    """How `result`'s choices are read for calls: the mode ("required" or "auto"), the
    model's tool format, and whether the legacy `functions` asked."""
    asked = result.metadata.get(TOOLS_KEY, "required")
    mode, legacy = asked.removesuffix(FUNCTIONS_SUFFIX), asked.endswith(FUNCTIONS_SUFFIX)
    return mode, result.model.tool_format if result.model else "", legacy


def _chat_choice(choice: Choice, reading: tuple[str, str, bool] | None = None) -> ChatChoice:
    content: str | None = choice.text
    calls: list[ToolCall] = []
    if reading is not None and reading[0] == "auto":
        parsed = parse_calls(choice.text, reading[1])
        content, calls = parsed.content, parsed.calls
    elif reading is not None:
        call = parse_tool_call(choice.text)
        content, calls = (None, [call]) if call is not None else (choice.text, [])
    if calls:
        assert reading is not None
        legacy = reading[2]
        message = (
            AssistantMessage(content=content, function_call=calls[0].function)
            if legacy
            else AssistantMessage(content=content, tool_calls=calls)
        )
        return ChatChoice(
            index=choice.index,
            message=message,
            logprobs=None if choice.logprobs is None else _chat_logprobs(choice.logprobs),
            finish_reason="function_call" if legacy else "tool_calls",
        )
    return ChatChoice(
        index=choice.index,
        message=AssistantMessage(content=choice.text),
        logprobs=None if choice.logprobs is None else _chat_logprobs(choice.logprobs),
        finish_reason=openai_finish_reason(choice.finish_reason),
        tokenmill=finish_note(choice.finish_reason),
    )


def _completion_choice(choice: Choice, result: GenerateResult) -> CompletionChoice:
    """`choice` in the completions shape; with the line's `echo` the prompt (its text, and
    its logprobs before the completion's), with its `prompt_logprobs` vLLM's field (the
    prompt's are the request's, the same for every choice)."""
    asked = result.metadata
    prompt = result.prompt_logprobs
    text, parts = choice.text, [] if choice.logprobs is None else [choice.logprobs]
    if ECHO_KEY in asked and result.prompt_text is not None:
        text = result.prompt_text + text
        if asked[ECHO_KEY] and prompt is not None:
            parts.insert(0, _top(prompt, int(asked[ECHO_KEY])))
    vllm = None
    if PROMPT_LOGPROBS_KEY in asked and prompt is not None:
        vllm = _vllm_prompt_logprobs(_top(prompt, int(asked[PROMPT_LOGPROBS_KEY])))
    return CompletionChoice(
        index=choice.index,
        text=text,
        logprobs=_completion_logprobs(*parts) if parts else None,
        finish_reason=openai_finish_reason(choice.finish_reason),
        prompt_logprobs=vllm,
        tokenmill=finish_note(choice.finish_reason),
    )


# tokenmill's finish reasons OpenAI's clients do not know, as the nearest they do: a choice
# cut short (cancelled, past its deadline) did not finish, as one cut at its length did not.
_OPENAI_FINISH: dict[str, str] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "length",
    FinishReason.DEADLINE: "length",
    FinishReason.ERROR: "stop",
}
OPENAI_FINISH_REASONS = frozenset(
    {"stop", "length", "tool_calls", "content_filter", "function_call"}
)


def openai_finish_reason(reason: str) -> str:
    """`reason` (a `FinishReason`, or OpenAI's own) as a value OpenAI's clients parse."""
    if reason in OPENAI_FINISH_REASONS:
        return str(reason)
    return _OPENAI_FINISH.get(reason, "stop")  # a StrEnum: its members hash as their text


def finish_note(reason: str) -> ChoiceNote | UnsetType:
    """The choice's `tokenmill` field: its own finish reason where `openai_finish_reason`
    had to change it (so a cancel stays visible), else none."""
    return UNSET if reason in OPENAI_FINISH_REASONS else ChoiceNote(finish_reason=str(reason))


def _top(lp: TokenLogprobs, k: int) -> TokenLogprobs:
    """`lp` with each position's alternatives cut to the `k` most likely."""
    return msgspec.structs.replace(
        lp,
        top_ids=[ids[:k] for ids in lp.top_ids],
        top_logprobs=[values[:k] for values in lp.top_logprobs],
        top_tokens=[texts[:k] for texts in lp.top_tokens],
    )


def _vllm_prompt_logprobs(lp: TokenLogprobs) -> list[dict[str, PromptLogprob] | None]:
    """A prompt's logprobs in vLLM's shape: null for the first token, then per token
    `{id: PromptLogprob}` of the token itself (first; its rank null when it is not among the
    k reported) and the k most likely (ranks 1..k)."""
    out: list[dict[str, PromptLogprob] | None] = []
    for i, (own, token, logprob, ids, values, texts) in enumerate(
        zip(
            lp.token_ids,
            lp.tokens,
            lp.token_logprobs,
            lp.top_ids,
            lp.top_logprobs,
            lp.top_tokens,
            strict=True,
        )
    ):
        if i == 0 and lp.unscored_first:
            out.append(None)
            continue
        rank = ids.index(own) + 1 if own in ids else None
        entry = {str(own): PromptLogprob(logprob=logprob, rank=rank, decoded_token=token)}
        for place, (tid, value, text) in enumerate(zip(ids, values, texts, strict=True), 1):
            entry.setdefault(str(tid), PromptLogprob(logprob=value, rank=place, decoded_token=text))
        out.append(entry)
    return out


def _chat_logprobs(lp: TokenLogprobs) -> ChatLogprobs:
    """The result's logprobs in chat's shape: `content`, one entry per token."""
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=token,
                logprob=logprob,
                bytes=list(token.encode()),
                top_logprobs=[
                    TopLogprob(token=text, logprob=value, bytes=list(text.encode()))
                    for text, value in zip(texts, values, strict=True)
                ],
            )
            for token, logprob, texts, values in zip(
                lp.tokens, lp.token_logprobs, lp.top_tokens, lp.top_logprobs, strict=True
            )
        ]
    )


def _completion_logprobs(*parts: TokenLogprobs, offset: int = 0) -> CompletionLogprobs:
    """The result's logprobs (with `echo`, the prompt's then the completion's) in the
    completions shape; a top-k dict also holds the chosen token, as OpenAI's do (two tokens
    with one text share an entry: the likelier stays). A prompt's first token is null.
    `offset`: the first token's `text_offset` (a streamed chunk's: the tokens' before it)."""
    tokens: list[str] = []
    logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    for lp in parts:
        for i, (token, logprob, texts, values) in enumerate(
            zip(lp.tokens, lp.token_logprobs, lp.top_tokens, lp.top_logprobs, strict=True)
        ):
            tokens.append(token)
            if i == 0 and lp.unscored_first:  # no logits score a prompt's first token
                logprobs.append(None)
                top.append(None)
                continue
            entry: dict[str, float] = {}
            for text, value in zip(texts, values, strict=True):
                entry.setdefault(text, value)  # most likely first
            entry.setdefault(token, logprob)
            logprobs.append(logprob)
            top.append(entry)
    offsets = list(itertools.accumulate((len(t) for t in tokens), initial=offset))[:-1]
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=logprobs, top_logprobs=top, text_offset=offsets
    )


def stream_logprobs(
    url: str, lp: TokenLogprobs, offset: int = 0
) -> ChatLogprobs | CompletionLogprobs:
    """A streamed event's logprobs in `url`'s shape: chat's `content`, or the completions
    shape with `text_offset` running on from `offset` (the token texts sent before)."""
    if url == CHAT_COMPLETIONS_URL:
        return _chat_logprobs(lp)
    return _completion_logprobs(lp, offset=offset)


def refusal_line(refused: BatchLineRefused, *, line_number: int) -> BatchOutputLine:
    """The output line for an input line that never became a request."""
    return BatchOutputLine(
        id=f"batch_req_{uuid.uuid4().hex}",
        custom_id=refused.custom_id,
        error=LineError(
            code=str(refused.code), message=refused.message, line=line_number, param=refused.param
        ),
    )
