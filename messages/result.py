"""`GenerateResult`: what the worker puts on the reply topic, one per request record."""

from __future__ import annotations

import enum

import msgspec

from messages.error_codes import ErrorCode
from messages.request import SCHEMA_VERSION


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end of sequence, a stop token or a stop string
    LENGTH = "length"  # max_new_tokens reached
    DEADLINE = "deadline"  # aborted at its deadline (the error says deadline_exceeded)
    CANCELLED = "cancelled"
    ERROR = "error"  # see `error`


class Usage(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Token counts. `cached_tokens`: of the prompt tokens, those whose K/V the prefix cache
    served (they were not computed again). With speculative decoding, the tokens guessed for
    the request that the model accepted (`accepted_draft_tokens`, part of the completion's
    tokens) and rejected (`rejected_draft_tokens`, computed and thrown away); 0 without it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    accepted_draft_tokens: int = 0
    rejected_draft_tokens: int = 0


class ModelRef(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True):
    name: str
    digest: str  # content hash of the weights
    quantization: str = "none"  # how its linear weights are held: int8, int4-g32, mixes, none
    # The format its chat template writes tool calls in (`messages.tool_formats.ToolFormat`):
    # how an answer is read for calls. "": tokenmill's `default` (or a worker that predates it).
    tool_format: str = ""
    # What it serves: "embed" for an embedding model (it answers `EmbedRequest`s only);
    # "" for a generative one (it answers `GenerateRequest`s only).
    task: str = ""


class Timings(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Milliseconds. `queued`: consumed → admitted to the engine; `total`: consumed → result."""

    queued_ms: float = 0.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    total_ms: float = 0.0


class ErrorInfo(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    code: ErrorCode
    message: str


class SourceRef(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Where the request record was read: lets a client correlate a result whose id is lost."""

    topic: str
    partition: int
    offset: int


class TokenLogprobs(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Logprobs of a result's tokens: entry `i` of each list is about `token_ids[i]` (a final
    stop or EOS token included, though the text leaves it out).

    - `tokens`: each token's text, decoded alone (special tokens included; a token that is only
      part of a UTF-8 character reads as U+FFFD).
    - `token_logprobs`: each token's natural-log probability.
    - `top_ids`, `top_logprobs`, `top_tokens`: the request's `logprobs` most likely tokens at
      that position, most likely first (empty lists when it asked for 0).

    Values are float32's, from the model's raw logits: before temperature, top-k/top-p,
    penalties and constraint masks (vLLM's default), so they do not change with the temperature.

    A prompt's (`GenerateResult.prompt_logprobs`) has one entry per prompt token and
    `unscored_first` true: no logits score the first prompt token, so entry 0's logprob (0.0)
    and its empty alternatives are placeholders, shown as null (OpenAI's and vLLM's shapes);
    `token_ids` holds the prompt's ids (a completion's are the result's `token_ids`).
    """

    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float] = msgspec.field(default_factory=list)
    top_ids: list[list[int]] = msgspec.field(default_factory=list)
    top_logprobs: list[list[float]] = msgspec.field(default_factory=list)
    top_tokens: list[list[str]] = msgspec.field(default_factory=list)
    unscored_first: bool = False
    token_ids: list[int] = msgspec.field(default_factory=list)  # a prompt's: its tokens' ids


class Choice(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One of the `n` choices of a request that asked for more than one."""

    index: int
    text: str = ""
    token_ids: list[int] = msgspec.field(default_factory=list)
    finish_reason: FinishReason = FinishReason.ERROR
    logprobs: TokenLogprobs | None = None


class GenerateResult(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """The answer to one request record: text and tokens, or `error` with a closed code.

    `id` is the request's; when the record could not be decoded it is the record key (or "").
    `logprobs`: when the request asked for them (`TokenLogprobs`), else None.
    `choices`: when the request asked for `n` > 1, every choice in order (`text`, `token_ids`,
    `finish_reason` and `logprobs` above are the first's; `usage.completion_tokens` counts all
    of them); empty otherwise. With `n` choices a result is up to `n` times larger: one past
    the producer's limit is answered `result_too_large`.
    `prompt_logprobs`: when the request asked for them, one entry per prompt token (the first a
    placeholder: `TokenLogprobs.unscored_first`); with `n` > 1 they are the request's, here
    once. `prompt_text`: then too, the prompt's tokens decoded as `text` is (special tokens
    left out), for echoing the prompt (OpenAI's `echo`).
    """

    v: int = SCHEMA_VERSION
    id: str
    text: str = ""
    token_ids: list[int] = msgspec.field(default_factory=list)
    finish_reason: FinishReason = FinishReason.ERROR
    usage: Usage = msgspec.field(default_factory=Usage)
    model: ModelRef | None = None
    timings: Timings = msgspec.field(default_factory=Timings)
    worker: str = ""
    error: ErrorInfo | None = None
    source: SourceRef | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    logprobs: TokenLogprobs | None = None
    choices: list[Choice] = msgspec.field(default_factory=list)
    prompt_logprobs: TokenLogprobs | None = None
    prompt_text: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
