"""`EmbedRequest` and `EmbedResult`: embedding jobs on the requests topic and their answers.

A worker that serves an embedding model (a sentence-transformers folder, e.g.
EmbeddingGemma-300M) answers `EmbedRequest`s; one that serves a generative model answers
`GenerateRequest`s. Each refuses the other kind with `unsupported_task`.

Records say which they are in the `tokenmill-schema` header (`messages.headers`):
`EmbedRequest/1` on a request, `EmbedResult/1` on its result. A request record without the
header is an embedding request when its body has `input` and none of `prompt`,
`prompt_token_ids` and `messages`; any other is a generation request (what producers have
always sent).

Schema evolution as for `GenerateRequest`: new fields get defaults, types never change,
unknown fields are ignored.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from messages.request import SCHEMA_VERSION, AwareDatetime
from messages.result import ErrorInfo, ModelRef, SourceRef, Timings

# One input: a text, or the token ids of one (run as given: no task prompt, no special tokens
# added). `EmbedRequest.input` is one input or a list of them, all of one kind.
EmbedInput = str | list[str | int | list[int]]

EncodingFormat = Literal["float", "base64"]
# What an input longer than the model takes does: "none" refuses the request
# (`prompt_too_long`); "end" keeps its first tokens (sentence-transformers' way); "start"
# keeps its last ones.
Truncate = Literal["none", "end", "start"]


class EmbedRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One embedding job: one vector per input.

    - `id`: the client's, unique; the result is keyed by it and carries it back.
    - `input`: a text; a list of texts; a list of token ids (one input); or a list of lists of
      token ids. At most `messages.limits.MAX_EMBED_INPUTS` inputs; none empty.
    - `dimensions`: keep the vectors' first `dimensions` values and normalize them again
      (Matryoshka truncation); None: the model's full width.
    - `encoding_format`: "float" (lists of numbers) or "base64" (each vector's float32 values,
      little-endian, base64-encoded: OpenAI's).
    - `prompt_name`: one of the model's task prompts (its `config_sentence_transformers.json`,
      e.g. "query", "document"), put before each text as sentence-transformers does; None: the
      model's default prompt, if it names one. Not applied to token-id inputs.
    - `truncate`: see `Truncate`.
    - `model`, `priority`, `deadline`, `timeout_ms`, `reply_to`, `metadata`: as for
      `GenerateRequest`.
    """

    v: int = SCHEMA_VERSION
    id: str = ""
    input: EmbedInput | None = None
    dimensions: int | None = None
    encoding_format: EncodingFormat = "float"
    prompt_name: str | None = None
    truncate: Truncate = "none"
    model: str | None = None
    priority: int = 0
    deadline: AwareDatetime | None = None
    timeout_ms: int | None = None
    reply_to: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class Embedding(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One input's vector, at its `index` in the request's `input`: a list of floats, or a
    base64 string (with `encoding_format` "base64")."""

    index: int
    embedding: list[float] | str


class EmbedUsage(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Tokens the model ran over (task prompts and special tokens included), after truncation."""

    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbedResult(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """The answer to one embedding request: one `Embedding` per input, in input order, or
    `error` with a closed code (`messages.error_codes`).

    `dimensions`: the vectors' length. `truncated`: how many inputs were cut to fit.
    `timings`: `queued_ms` and `total_ms` (no token timings)."""

    v: int = SCHEMA_VERSION
    id: str
    data: list[Embedding] = msgspec.field(default_factory=list)
    dimensions: int = 0
    truncated: int = 0
    usage: EmbedUsage = msgspec.field(default_factory=EmbedUsage)
    model: ModelRef | None = None
    timings: Timings = msgspec.field(default_factory=Timings)
    worker: str = ""
    error: ErrorInfo | None = None
    source: SourceRef | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None
