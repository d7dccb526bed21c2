"""OpenAI Batch API JSONL: the input line, the request bodies tokenmill runs, the output line.

Input, one JSON object per line (what OpenAI's Batch API and vLLM's `run_batch` accept):

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}],
              "max_tokens": 32}}

Output, one JSON object per answered input line:

    {"id": "batch_req_…", "custom_id": "q1",
     "response": {"status_code": 200, "request_id": "…", "body": {chat.completion object}},
     "error": null}

A `/v1/embeddings` line becomes an `EmbedRequest` and is answered with OpenAI's embeddings
list (`messages.openai_embeddings`); a file may mix endpoints (OpenAI's Batch API takes one
endpoint per batch, and so do the gateway's `/v1/batches`).

A request the worker refused has `response.status_code` 4xx/5xx and an OpenAI error body; a
line that never became a request (not JSON, no `custom_id`, a duplicate `custom_id`, an
unsupported `url`, a body that cannot be mapped) has `response: null` and `error` with the
code, the message and the input line number.

Penalties and biases are honoured: OpenAI's `presence_penalty`, `frequency_penalty` and
`logit_bias` (keys are token ids written as strings), and vLLM's `repetition_penalty`, `min_p`
and `min_tokens`. So are vLLM's extras: `ignore_eos`, `skip_special_tokens`,
`include_stop_str_in_output`, `truncate_prompt_tokens`, `priority`, `request_id`,
`return_tokens_as_token_ids`, and chat's `chat_template_kwargs`, `add_generation_prompt` and
`continue_final_message`. Known fields tokenmill cannot honour (`suffix`, …) are refused. A
field it does not know is refused in a batch file (the line's error names it), and ignored by
the gateway's HTTP doors unless `--strict-fields` (`to_request`'s `ignore_unknown`); fields
that cannot change the answer (`user`, `stream_options`, … `HARMLESS` in the mapping) are
ignored everywhere.

Omitted fields: by default (`tokenmill batch run`) the wire's deterministic defaults apply:
greedy, 16 new tokens. With `openai_defaults` (the gateway's doors and its Batch API) they mean
what they mean to OpenAI's clients: a chat without `max_tokens` runs to EOS (or the worker's
limit and the context), and an omitted `temperature`, `top_p` or `top_k` takes the model's
recommended values, else OpenAI's; the worker fills them (`GenerateRequest.model_defaults`).

Logprobs are served: completions' `logprobs: k` and chat's `logprobs: true` with
`top_logprobs: k` (k in 0..20), in OpenAI's shapes (`CompletionLogprobs`, `ChatLogprobs`). The
values are the model's raw logits' (before temperature, penalties and constraints: vLLM's
default); token texts are each token decoded alone (a piece of a UTF-8 character reads as
U+FFFD, and its `bytes` are that text's).

Prompt logprobs, completions only: `echo: true` answers with the prompt's text before the
completion's and, with `logprobs: k`, the prompt's tokens before the completion's in
`logprobs` (the first prompt token's `token_logprobs` and `top_logprobs` entries null, as no
logits score it); `max_tokens: 0` is allowed with it (score a text, generate nothing). vLLM's
`prompt_logprobs: k` answers with the choice's `prompt_logprobs` in vLLM's shape
(`PromptLogprob`): null first, then per prompt token `{token id: {logprob, rank,
decoded_token}}` holding the token and the k most likely (`rank` null for a token outside them).

Constraints are served in the fields users' files carry, one per line: OpenAI's
`response_format` (chat), vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`,
`json_object`) and its older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`
(`messages.openai_guided`). Chat `tools` with `tool_choice` "required" or a named function
constrain the answer to one call, returned as `message.tool_calls` with `finish_reason`
"tool_calls"; "none" ignores the tools. "auto" (the default with tools) lets the model answer
in text or call tools in its own format, the tools rendered by its chat template, each call's
arguments constrained to its tool's schema (`messages.tool_formats`); `parallel_tool_calls`
false allows one call at most. Earlier turns' `tool_calls` and `tool` messages are rendered
by the chat template. The legacy `functions` and `function_call` are read as `tools` and
`tool_choice`, and answered as `message.function_call` (`finish_reason` "function_call").
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from messages.openai_tools import (
    FunctionCall,
    FunctionDef,
    NamedFunction,
    NamedTool,
    Tool,
    ToolCall,
)

COMPLETIONS_URL = "/v1/completions"
CHAT_COMPLETIONS_URL = "/v1/chat/completions"
EMBEDDINGS_URL = "/v1/embeddings"  # its bodies and answers: `messages.openai_embeddings`
SUPPORTED_URLS = (COMPLETIONS_URL, CHAT_COMPLETIONS_URL, EMBEDDINGS_URL)


class BatchInputLine(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    custom_id: str
    method: str = "POST"
    url: str
    body: dict[str, Any]


class _SamplingFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """What both endpoints share. `None` means "not given": the run's default applies."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extension
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None  # null means the default everywhere below, as OpenAI reads it
    stream: bool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token ids as strings → bias
    stop_token_ids: list[int] | None = None  # vLLM's extension
    repetition_penalty: float | None = None  # vLLM's extension, and the two below
    min_p: float | None = None
    min_tokens: int | None = None
    # Constraints, vLLM's (`messages.openai_guided`); at most one per body.
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    speculate: bool | None = None  # tokenmill's: false opts out of speculative decoding
    # vLLM's extras (`GenerateRequest` has their meaning); `priority`: lower runs earlier, as
    # vLLM reads it; `request_id`: names the answer (`REQUEST_ID_KEY`); the last: logprobs'
    # tokens written "token_id:N".
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    truncate_prompt_tokens: int | None = None
    priority: int | None = None
    request_id: str | None = None
    return_tokens_as_token_ids: bool | None = None


class CompletionBody(_SamplingFields, kw_only=True, forbid_unknown_fields=False):
    """`/v1/completions`: one prompt, as text or as token ids."""

    prompt: str | list[int | str]
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None
    prompt_logprobs: int | None = None  # vLLM's extension: the prompt tokens' logprobs


class ContentPart(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    type: str
    text: str | None = None


class ChatMessageIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """A turn. An assistant's earlier calls (`tool_calls`, or the legacy `function_call`)
    and a `tool` turn's `tool_call_id` are rendered by the chat template; `name` is a tool's
    (a `tool` or legacy `function` turn) or a participant's."""

    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    function_call: FunctionCall | None = None  # legacy: an assistant's one call


class ChatCompletionBody(_SamplingFields, kw_only=True, forbid_unknown_fields=False):
    """`/v1/chat/completions`: a conversation; the worker applies the model's chat template."""

    messages: list[ChatMessageIn]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # with `logprobs: true`: alternatives per token, 0..20
    tools: list[Tool] | None = None
    tool_choice: str | NamedTool | None = None  # "none", "auto", "required" or a named one
    parallel_tool_calls: bool | None = None  # false: one call at most (under "auto")
    functions: list[FunctionDef] | None = None  # legacy `tools`
    function_call: str | NamedFunction | None = None  # legacy `tool_choice`
    response_format: dict[str, Any] | None = None
    # vLLM's chat template extras (`GenerateRequest`)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None


class ErrorObject(msgspec.Struct, kw_only=True):
    """OpenAI's error object, the body of a non-200 response."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    error: ErrorObject


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


class CompletionTokensDetails(msgspec.Struct, kw_only=True):
    """OpenAI's names for speculative decoding's guesses (its "predicted outputs"): those the
    model accepted (part of the completion) and those it rejected."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class TokenUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = msgspec.field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = msgspec.field(
        default_factory=CompletionTokensDetails
    )


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """A completion choice's `logprobs` (the legacy completions shape), one entry per token:
    its text, its logprob, `{token text: logprob}` of the `logprobs` most likely tokens (and the
    chosen one, when not among them: up to k + 1 entries, as OpenAI gives), and where its text
    starts in the completion's text (its tokens' texts laid end to end). With `echo` the
    prompt's tokens come first, the first one's logprob and alternatives null."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(msgspec.Struct, kw_only=True):
    """One token at one prompt position, in vLLM's `prompt_logprobs` shape: its logprob, its
    rank among the position's alternatives (1 = most likely; null when it is not among the k
    reported) and its text decoded alone."""

    logprob: float
    rank: int | None = None
    decoded_token: str


class ChoiceNote(msgspec.Struct, kw_only=True):
    """tokenmill's own word on a choice, beside OpenAI's fields: its finish reason where
    OpenAI's has no such value (`cancelled`, `deadline`, `error`; `finish_reason` then says
    the nearest one OpenAI's clients parse). Left out of the answer when there is none."""

    finish_reason: str


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str
    # vLLM's: per prompt token (null for the first), by token id (as a string)
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
    tokenmill: ChoiceNote | UnsetType = UNSET  # ours: what `finish_reason` cannot say


class Completion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: TokenUsage


class AssistantMessage(msgspec.Struct, kw_only=True):
    """`tool_calls` (or the legacy `function_call`) written only for an answer that calls;
    `content` is then the text before the calls, or None."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET
    function_call: FunctionCall | msgspec.UnsetType = msgspec.UNSET  # legacy `functions`' call


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None  # the UTF-8 bytes of `token`


class ChatTokenLogprob(msgspec.Struct, kw_only=True):
    """One generated token in a chat choice's `logprobs.content`, with its `top_logprobs`
    (the request's `top_logprobs` most likely tokens, most likely first)."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[ChatTokenLogprob] | None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str
    tokenmill: ChoiceNote | UnsetType = UNSET  # ours: what `finish_reason` cannot say


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: TokenUsage


class BatchResponse(msgspec.Struct, kw_only=True):
    status_code: int
    request_id: str
    # Completion | ChatCompletion | EmbeddingList | ErrorBody (msgspec decodes no untagged union)
    body: Any


class LineError(msgspec.Struct, kw_only=True):
    """Why an input line never became a request; `line` is its 1-based number in the file."""

    code: str
    message: str
    line: int
    param: str | None = None


class BatchOutputLine(msgspec.Struct, kw_only=True):
    id: str
    custom_id: str | None
    response: BatchResponse | None = None
    error: LineError | None = None


class AnsweredLine(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """What a resumed run reads back from an output line: which input line it answered."""

    custom_id: str | None = None
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def line(self) -> int | None:
        """The input line number of an error line with no usable `custom_id`."""
        number = (self.error or {}).get("line")
        return number if isinstance(number, int) else None

    @property
    def status_code(self) -> int | None:
        code = (self.response or {}).get("status_code")
        return code if isinstance(code, int) else None
