"""InFlight: what the GPU actor keeps of each request an engine is running (and what it asks
the engine to run for it: `engine_request`).

One record per running request id, so nothing is kept in step by hand: the engine that runs
it, the model its result names, when it was admitted, whether it was already queued again
after a crash, and its copies (the same request consumed again while it runs: a redelivery, a
client's retry), which are answered with its result.

A copy is the same request for the same reader: an equal request and the same reply
topic (`is_copy`). Anything else under a running id is another request, and its result must
not be this one's (another producer would read it): the GPU actor answers it
`duplicate_request` on its own reply topic instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.ingest.model_front import EmbedInputs, Tokens
from actors.mail import Admitted
from actors.streaming.token_stream import TokenStream
from gpu.engine import Completion, EngineRequest, StepOutput
from gpu.engine_io import EmbedJob
from gpu.sequence import Constraint, SamplingParams
from messages.embedding import EmbedRequest
from messages.openai_tools import auto_constraint_text
from messages.result import ModelRef


class EngineLike(Protocol):
    """What the GPU actor needs of an engine (`gpu.engine.Engine`, `gpu.encoder`'s engine for
    an embedding model, the benchmark's echo engine). An engine that embeds says how in its
    `embedding` (an `EmbeddingSpec`; None or absent: it generates)."""

    model: Any  # .name, .digest, .path, .tokenizer, .config
    config: Any  # its EngineConfig

    def prepare(self, request: EngineRequest) -> None: ...  # thread-safe; slow part of add
    def add(self, request: EngineRequest) -> None: ...
    def step(self) -> StepOutput: ...
    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None: ...
    def has_work(self) -> bool: ...


@dataclass(slots=True)
class InFlight:
    item: Admitted
    engine: EngineLike  # the engine running it
    model: ModelRef  # the model its result names
    admitted_at: float  # monotonic seconds
    requeued: bool = False  # queued again after a crash: a second crash fails it
    copies: list[Admitted] = field(default_factory=list)
    # when the request asked for chunks (`item`'s only): one per choice, by index
    streams: list[TokenStream] = field(default_factory=list)

    @property
    def everyone(self) -> list[Admitted]:
        """The request and its copies: each gets the result."""
        return [self.item, *self.copies]

    def is_copy(self, item: Admitted) -> bool:
        """`item` (with this request's id) asks exactly what this one runs, and its result goes
        where this one's does: it may be answered with this run's result."""
        return item.reply_topic == self.item.reply_topic and item.request == self.item.request


def engine_request(item: Admitted, tokens: Tokens) -> EngineRequest:
    """What an engine runs for `item`, with `tokens` made for that engine's model: a
    generation request's prompt, or an embedding request's inputs (`EngineRequest.embed`)."""
    request = item.request
    if isinstance(request, EmbedRequest) or isinstance(tokens, EmbedInputs):
        assert isinstance(request, EmbedRequest) and isinstance(tokens, EmbedInputs)
        return EngineRequest(
            request_id=request.id,
            prompt_token_ids=tokens.tokens,
            priority=request.priority,
            arrival_time=item.consumed_at,
            embed=EmbedJob(tuple(tokens.inputs), request.dimensions),
        )
    shape = request.response_format
    schema = shape.schema_text() if shape is not None else None
    constraint = None if shape is None or schema is None else Constraint.json(schema, shape.strict)
    if request.structured_output is not None:  # the door let at most one through
        constraint = Constraint(*request.structured_output.rule())
    if request.tool_calling is not None and request.tools:  # free text or calls of the tools
        text = auto_constraint_text(request.tools, request.tool_calling.parallel)
        constraint = Constraint("tools", text)
    params = SamplingParams(
        max_new_tokens=request.max_new_tokens,
        n=request.n,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=request.seed,
        stop=tuple(request.stop),
        stop_token_ids=tuple(request.stop_token_ids),
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty,
        min_p=request.min_p,
        logit_bias=tuple(request.logit_bias.items()),
        min_tokens=request.min_tokens,
        constraint=constraint,
        logprobs=request.logprobs,
        prompt_logprobs=request.prompt_logprobs,
        speculate=request.speculate,
        ignore_eos=request.ignore_eos,
        skip_special_tokens=request.skip_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
    )
    return EngineRequest(
        request_id=request.id,
        prompt_token_ids=tokens,
        params=params,
        priority=request.priority,
        arrival_time=item.consumed_at,
    )
