"""`GenerateRequest`: what a producer puts on the requests topic.

Schema evolution: every field added later gets a default, a field's type never changes, and
unknown fields are ignored, so old and new producers and workers keep talking. `v` is the
schema version the producer wrote.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import msgspec

from messages.openai_tools import Tool, ToolCall
from messages.response_format import ResponseFormat
from messages.structured_output import StructuredOutput

SCHEMA_VERSION = 1

# The fields `GenerateRequest.model_defaults` may name: the worker fills them from its model.
MODEL_DEFAULTS = ("max_new_tokens", "temperature", "top_p", "top_k")

AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]


class ChatMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True):
    """One chat turn. An assistant turn that called tools carries its `tool_calls` (their
    arguments as JSON text, OpenAI's); a `tool` turn (a tool's result) the `tool_call_id` it
    answers, and maybe the tool's `name`."""

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """This turn as chat templates take it (Hugging Face's `apply_chat_template`): a
        call's arguments as the parsed object (templates write `arguments | tojson`), or the
        text when it is not JSON."""
        turn: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            turn["tool_calls"] = [
                {
                    "id": call.id,
                    "type": call.type,
                    "function": {
                        "name": call.function.name,
                        "arguments": _parsed(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            turn["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            turn["name"] = self.name
        return turn


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments


class ToolCalling(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True):
    """tool_choice "auto": the output is free text or calls of the request's `tools`, in the
    model's own tool-call format (`messages.tool_formats`), each call's arguments constrained
    to its tool's parameters. `parallel`: one or more calls; False: at most one."""

    parallel: bool = True


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One generation job. Give exactly one of `prompt`, `prompt_token_ids`, `messages`.

    - `id`: the client's, unique; the result is keyed by it and carries it back.
    - `messages`: a chat, rendered with the model's chat template by the worker.
    - Sampling defaults are deliberately boring: greedy (`temperature` 0), 16 new tokens.
    - `deadline` (RFC 3339 with a zone) and `timeout_ms` (from the record's timestamp): the
      earlier one wins; a request past it is answered with `deadline_exceeded`.
    - `reply_to`: topic for the result (default: the worker's results topic).
    - `metadata`: echoed back unchanged in the result.
    - `response_format`: constrain the output to JSON (`messages.response_format`).
    - `structured_output`: constrain the output to a regex, one of a list of strings, or a
      Lark/GBNF grammar (`messages.structured_output`); at most one of it and a constrained
      `response_format`.
    - Penalties and biases, applied to the raw logits before temperature (vLLM's order;
      `gpu.penalties`): `presence_penalty` and `frequency_penalty` in [-2, 2] (OpenAI's, over
      the completion's tokens), `repetition_penalty` in [0.01, 2] (transformers' and vLLM's,
      over prompt and completion; 1 = off), `logit_bias` (token id → bias in [-100, 100], at
      most 300 entries; JSON keys are the ids as strings), `min_tokens` in [0,
      `max_new_tokens`] (EOS, `stop_token_ids` and stop strings wait until that many tokens
      are out). `min_p` in [0, 1], after temperature: keep tokens at least that fraction of
      the top token's probability.
    - `logprobs`: None (off), or how many most likely alternatives to report beside each
      generated token's own logprob, 0 to `messages.limits.MAX_LOGPROBS` (20); the result's
      `logprobs` holds them. Computed from the model's raw logits, before temperature,
      top-k/top-p, penalties and constraint masks (vLLM's default).
    - `n`: how many choices to generate, 1 to `messages.limits.MAX_CHOICES` (16); the result's
      `choices` holds them all (its `text` and `token_ids` are the first's). They share the
      prompt's prefill; a seeded request gives the same choices every time. Not with `stream`.
    - `prompt_logprobs`: None (off), or how many most likely alternatives to report beside each
      prompt token's own logprob, 0 to `messages.limits.MAX_PROMPT_LOGPROBS` (20); the result's
      `prompt_logprobs` holds them (the first prompt token has none) and its `prompt_text` the
      prompt decoded. Such a request computes its whole prompt (no prefix-cache hits: a cached
      block has no logits). With it, `max_new_tokens` may be 0: the prompt is scored and
      nothing generated (perplexity of a text).
    - `tools`: function tools the chat template renders for the model (with `messages`; at
      most `messages.limits.MAX_TOOLS`). `tool_calling`: with them, let the model call them in
      its own format (tool_choice "auto", `ToolCalling`); a constraint, so not beside a
      constrained `response_format` or a `structured_output`.
    - `speculate`: False opts this request out of speculative decoding when the worker runs
      with it (`--speculative`); its output is the same either way (greedy: token for token;
      sampled: the same distribution), only its speed and `usage`'s draft counts differ.
    - `model_defaults`: fields the client left out that the worker fills from the model it
      runs (`MODEL_DEFAULTS`), replacing what the request carries for them (what an older
      worker runs): "max_new_tokens" becomes the worker's `--max-new-tokens-limit` or the
      room the context leaves after the prompt, whichever is smaller; "temperature",
      "top_p" and "top_k" become the model's `generation_config.json` values (a GGUF's
      `general.sampling.*`), else OpenAI's (1.0, 1.0, off). Empty (the default): the request
      runs as written, the wire's deterministic defaults included.
    - Output: `ignore_eos` generates past EOS (it stops at `stop`, `stop_token_ids` and the
      length limit only); `skip_special_tokens` false keeps special tokens in the text;
      `include_stop_str_in_output` keeps the stop string (or stop token's text) that ended
      the output at its end.
    - `truncate_prompt_tokens`: keep only the prompt's last k tokens (-1: as many as the
      model's prompt limit allows); None: a prompt over the limit is refused.
    - Chat template (with `messages`): `add_generation_prompt` (default true) opens the
      assistant's turn; `continue_final_message` leaves the last message open so the model
      continues it (not with `add_generation_prompt`); `chat_template_kwargs`: more
      variables for the template (e.g. `enable_thinking`), under the names it already has.
    """

    v: int = SCHEMA_VERSION
    id: str = ""
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    max_new_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    model: str | None = None
    priority: int = 0
    deadline: AwareDatetime | None = None
    timeout_ms: int | None = None
    reply_to: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    # Streaming (see messages.chunk): partial results on the reply topic before the result,
    # every `stream_interval_tokens` tokens or `stream_interval_ms`, whichever comes first
    # (None: the worker's defaults).
    stream: bool = False
    stream_interval_tokens: int | None = None
    stream_interval_ms: float | None = None
    response_format: ResponseFormat | None = None
    structured_output: StructuredOutput | None = None  # beside response_format: one at most
    # Penalties and biases (`gpu.penalties`; ranges in `messages.limits`); the defaults are off.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)
    min_tokens: int = 0
    logprobs: int | None = None
    n: int = 1
    prompt_logprobs: int | None = None
    speculate: bool = True
    model_defaults: list[str] = msgspec.field(default_factory=list)  # of MODEL_DEFAULTS
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    tools: list[Tool] | None = None
    tool_calling: ToolCalling | None = None
