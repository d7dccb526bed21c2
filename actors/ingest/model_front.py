"""What the ingest needs of the model that will run a request: its names, tokenizer and limits.

The ingest tokenizes and checks every request before it is queued, so a request that cannot
run is answered at once with a typed error instead of occupying a bucket and an engine slot.

A model serves one task: a generative one (`embedding` None) answers `GenerateRequest`s, an
embedding one (`embedding`: its `EmbeddingSpec`, read from the engine's `embedding`) answers
`EmbedRequest`s; `tokenize` refuses the other kind with `unsupported_task`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import msgspec

from gpu.encoder import inputs as encoder_inputs
from gpu.encoder.spec import EmbeddingSpec
from gpu.loading.sampling_defaults import SamplingDefaults, read_sampling_defaults
from messages.admission import check_lengths, check_sampling, check_vocabulary, prompt_limit
from messages.embedding import EmbedRequest
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import cut, number_text, result_size_bound
from messages.request import GenerateRequest
from messages.request_kinds import Request
from messages.result import ModelRef
from messages.tool_formats import ToolFormat, detect_format
from messages.validation import embed_inputs

if TYPE_CHECKING:
    from gpu.loading.tokenizer import Tokenizer


class TokenizerLike(Protocol):
    chat_template: str | None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class EmbedInputs:
    """An embedding request's inputs as the encoder runs them: each one's tokens, final (task
    prompt, special tokens, truncation), in input order."""

    inputs: tuple[list[int], ...]
    truncated: int = 0  # how many were cut to fit the model

    @property
    def tokens(self) -> list[int]:
        """Every input's tokens, one after another: what the request weighs in the buckets,
        the token budget and the backpressure (`EngineRequest.prompt_token_ids`)."""
        return [token for one in self.inputs for token in one]


# What `ModelFront.tokenize` makes of a request: a generation request's prompt tokens, or an
# embedding request's inputs.
Tokens = list[int] | EmbedInputs


@dataclass(frozen=True)
class ModelFront:
    name: str
    digest: str
    aliases: frozenset[str]  # every name a request's `model` field may use for this model
    tokenizer: TokenizerLike
    vocab_size: int
    max_model_len: int
    max_prompt_tokens: int
    max_new_tokens: int
    max_token_bytes: int = 64  # the most bytes one token decodes to (bounds a result's size)
    quantization: str = "none"  # `gpu.quant.scheme.describe` of its weights
    # What `model_defaults`' temperature, top_p and top_k take (`_fill_sampling`).
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    # The format its chat template writes tool calls in (`messages.tool_formats`); "" for
    # tokenmill's default (a template with none).
    tool_format: str = ""
    # An embedding model's pipeline and limits; None for a generative model.
    embedding: EmbeddingSpec | None = None

    @classmethod
    def of_engine(cls, engine: Any) -> ModelFront:
        """The front of an `gpu.engine.Engine` or `gpu.encoder` engine (or anything shaped like
        one). An embedding model's limit is its longest input; it generates nothing."""
        model = engine.model
        aliases = {model.name, model.digest, Path(model.path).name, Path(model.path).stem}
        embedding = getattr(engine, "embedding", None)
        if embedding is not None:
            max_model_len = max_prompt_tokens = embedding.max_tokens
            max_new_tokens = 0
        else:
            max_model_len = engine.max_model_len
            max_prompt_tokens = prompt_limit(engine.config.max_prompt_tokens, max_model_len)
            max_new_tokens = engine.config.max_new_tokens
        return cls(
            name=model.name,
            digest=model.digest,
            aliases=frozenset(aliases),
            tokenizer=model.tokenizer,
            vocab_size=model.config.vocab_size,
            max_model_len=max_model_len,
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens,
            max_token_bytes=getattr(model.tokenizer, "max_token_bytes", 64),
            quantization=getattr(model, "quantization", "none"),
            sampling_defaults=read_sampling_defaults(Path(model.path)),
            tool_format=tool_format_of(getattr(model.tokenizer, "chat_template", None)),
            embedding=embedding,
        )

    @property
    def result_size_bound(self) -> int:
        """The largest result a request on this model can produce (see `messages.limits`)."""
        return result_size_bound(
            max_new_tokens=self.max_new_tokens, max_token_bytes=self.max_token_bytes
        )

    @property
    def ref(self) -> ModelRef:
        return ModelRef(
            name=self.name,
            digest=self.digest,
            quantization=self.quantization,
            tool_format=self.tool_format,
            task="embed" if self.embedding is not None else "",
        )

    def tokenize(self, request: Request) -> Tokens:
        """`request`'s tokens on this model (`prompt_tokens`, `embed_inputs`); raises
        `InvalidRequest`, `unsupported_task` for a request of the task it does not serve."""
        if isinstance(request, EmbedRequest):
            return self.embed_inputs(request)
        if self.embedding is not None:
            raise InvalidRequest(
                ErrorCode.UNSUPPORTED_TASK,
                f"this worker serves {self.name!r}, an embedding model: it answers embedding "
                "requests (EmbedRequest) only; send generation requests to a worker that serves a "
                "generative model",
            )
        return self.prompt_tokens(request)

    def embed_inputs(self, request: EmbedRequest) -> EmbedInputs:
        """Tokenize and check an embedding request against this model; raises
        `InvalidRequest`.

        Texts get the task prompt (`prompt_name`, else the model's default) and the special
        tokens, as sentence-transformers adds them (`gpu.encoder.inputs.embed_tokens`); token
        ids run as given. An input longer than the model takes is refused (`truncate` "none")
        or cut (`gpu.encoder.inputs.fit`): its first tokens kept ("end") or its last
        ("start"), a text's special tokens kept as sentence-transformers keeps them.
        """
        spec = self.embedding
        if spec is None:
            raise InvalidRequest(
                ErrorCode.UNSUPPORTED_TASK,
                f"this worker serves {self.name!r}, a generative model: it answers generation "
                "requests (GenerateRequest) only; send embedding requests to a worker that "
                "serves an embedding model",
            )
        self._check_model(request.model)
        dimensions = request.dimensions
        if dimensions is not None and dimensions > spec.dimensions:
            raise InvalidRequest(
                ErrorCode.INVALID_DIMENSIONS,
                f"dimensions must be in [1, {spec.dimensions}] for model {self.name!r}, "
                f"got {number_text(dimensions)}",
            )
        name = request.prompt_name
        if name is not None and name not in spec.prompts:
            known = ", ".join(sorted(spec.prompts)) or "none"
            raise InvalidRequest(
                ErrorCode.UNKNOWN_PROMPT_NAME,
                f"prompt_name {cut(name, 64)!r} is not one of model {self.name!r}'s task "
                f"prompts ({known})",
            )
        name = spec.default_prompt_name if name is None else name
        out: list[list[int]] = []
        truncated = 0
        for index, one in enumerate(embed_inputs(request.input)):
            if isinstance(one, str):
                # An encoder engine's tokenizer is a `gpu.loading.tokenizer.Tokenizer`.
                tokenizer = cast("Tokenizer", self.tokenizer)
                ids = encoder_inputs.embed_tokens(tokenizer, spec, one, name)
            else:
                check_vocabulary(one, self.vocab_size, f"input {index}")
                ids = list(one)
            if len(ids) > spec.max_tokens:
                if request.truncate == "none":
                    raise InvalidRequest(
                        ErrorCode.PROMPT_TOO_LONG,
                        f"input {index} is {len(ids)} tokens; model {self.name!r} takes at most "
                        f'{spec.max_tokens} (set truncate to "end" or "start" to cut it)',
                    )
                specials = spec.specials if isinstance(one, str) else (0, 0)
                ids, _ = encoder_inputs.fit(ids, spec.max_tokens, request.truncate, specials)
                truncated += 1
            out.append(ids)
        return EmbedInputs(tuple(out), truncated)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.aliases:
            raise InvalidRequest(
                ErrorCode.UNKNOWN_MODEL,
                f"model {model!r} is not served here; this worker runs {self.name!r}",
            )

    def prompt_tokens(self, request: GenerateRequest) -> list[int]:
        """Tokenize and check `request` against this model; raises `InvalidRequest`.

        Plain prompts get the tokenizer's special tokens (as `tokenmill generate` does); chat
        messages are rendered with the model's chat template, which already holds them. The
        rules are `messages.admission`'s, against this model's vocabulary and limits, once the
        prompt is cut to `truncate_prompt_tokens` and the fields the request leaves to the
        model (`model_defaults`) are filled in `request` itself (`_fill_sampling`,
        `_fill_max_new_tokens`: filling them again, for another model, gives that model's).
        """
        self._check_model(request.model)
        _fill_sampling(request, self.sampling_defaults)
        check_sampling(request, vocab_size=self.vocab_size)
        if request.prompt_token_ids is not None:
            ids = request.prompt_token_ids
            check_vocabulary(ids, self.vocab_size, "prompt_token_ids")
        elif request.messages is not None:
            if not self.tokenizer.chat_template:
                raise InvalidRequest(
                    ErrorCode.INVALID_PROMPT,
                    f"model {self.name!r} has no chat template; send `prompt` instead",
                )
            chat = [m.for_template() for m in request.messages]
            tools = [msgspec.to_builtins(t) for t in request.tools] if request.tools else None
            text = self.tokenizer.apply_chat_template(
                chat,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                template_kwargs=request.chat_template_kwargs,
                tools=tools,
            )
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(request.prompt or "")
        keep = request.truncate_prompt_tokens
        if keep is not None:
            keep = self.max_prompt_tokens if keep == -1 else keep
            ids = ids[-keep:] if len(ids) > keep else ids
        _fill_max_new_tokens(request, self.max_new_tokens, self.max_model_len - len(ids))
        check_lengths(
            len(ids),
            request.max_new_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            max_new_tokens_limit=self.max_new_tokens,
            max_model_len=self.max_model_len,
            scoring=request.prompt_logprobs is not None,
        )
        return ids


def tool_format_of(chat_template: str | None) -> str:
    """`ModelRef.tool_format` of a model with this chat template."""
    found = detect_format(chat_template)
    return "" if found is ToolFormat.DEFAULT else str(found)


def result_size_refusal(front: ModelFront, max_message_bytes: int) -> str | None:
    """Why a worker sending at most `max_message_bytes` a record may not serve `front` (its
    results could be larger), or None when every result it can make fits. An embedding
    model's results grow with the request's inputs, not the model: one too large for the
    producer is answered `result_too_large` when it is made."""
    if front.embedding is not None:
        return None
    bound = front.result_size_bound
    if bound <= max_message_bytes:
        return None
    return (
        f"model {front.name!r} can produce results of up to {bound} bytes "
        f"(max_new_tokens {front.max_new_tokens} × up to {front.max_token_bytes} bytes a token, "
        f"plus the echoed id and metadata), over max_message_bytes {max_message_bytes}: "
        "raise --max-message-bytes (and the reply topics' max.message.bytes) or lower "
        "--max-new-tokens-limit"
    )


# What a request leaves to the model (`GenerateRequest.model_defaults`), filled here: the
# gateway holds no model, so a client's omitted `max_tokens`, `temperature`, `top_p` and `top_k`
# travel as names and the worker that tokenizes the request fills them, in the request itself,
# before its lengths are checked (idempotent per model: a request tokenized again for another
# model, a flip, takes that model's values).
# What an omitted field means when the model recommends nothing: OpenAI's defaults.
OPENAI_TEMPERATURE = 1.0
OPENAI_TOP_P = 1.0
OPENAI_TOP_K = 0  # off


def _fill_sampling(request: GenerateRequest, model: SamplingDefaults) -> None:
    """Set the `temperature`, `top_p` and `top_k` that `request.model_defaults` names to the
    model's recommendation, else OpenAI's default."""
    asked = request.model_defaults
    if not asked:
        return
    if "temperature" in asked:
        temperature = model.temperature
        request.temperature = OPENAI_TEMPERATURE if temperature is None else temperature
    if "top_p" in asked:
        request.top_p = OPENAI_TOP_P if model.top_p is None else model.top_p
    if "top_k" in asked:
        # a recommended -1 means off, as 0 does here
        request.top_k = OPENAI_TOP_K if model.top_k is None else max(model.top_k, 0)


def _fill_max_new_tokens(request: GenerateRequest, limit: int, room: int) -> None:
    """When `request.model_defaults` names `max_new_tokens`: run to EOS, or to the worker's
    `limit`, or to the end of the context (`room`: what the prompt leaves), whichever comes
    first. A prompt that leaves no room keeps the request's value, for `check_lengths` to
    refuse it saying why."""
    if "max_new_tokens" in request.model_defaults and room > 0:
        request.max_new_tokens = min(limit, room)
