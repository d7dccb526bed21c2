"""A request inside the engine: its tokens, sampling parameters and progress.

Pure Python (no torch): the scheduler and its tests work on these objects alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # gpu.logprobs holds tensor code; this module stays torch-free
    from gpu.logprobs import TokenLogprob

GREEDY_BELOW = 1e-5  # temperatures under this are greedy


ConstraintKind = Literal["json", "regex", "choice", "grammar", "tools"]


@dataclass(frozen=True)
class Constraint:
    """The output must match `text`, read as its `kind` says (the engine's grammar cache is
    keyed by all three):

    - "json": JSON matching a JSON Schema, as compact text; `strict`: refuse a schema keyword
      the grammar cannot enforce rather than ignore it;
    - "regex": the whole output matches the regular expression (the regex crate's syntax);
    - "choice": the output is one of the strings of a JSON list;
    - "grammar": the output is a sentence of a Lark (or GBNF) grammar;
    - "tools": free text or calls of tools in the model's own format, each call's arguments
      valid against its tool's parameters (`messages.tool_formats.constraint_text`: the
      grammar is built for the model's chat template where it is compiled).
    """

    kind: ConstraintKind
    text: str
    strict: bool = False

    @classmethod
    def json(cls, schema: str, strict: bool = False) -> Constraint:
        return cls("json", schema, strict)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. The default is greedy: temperature 0.

    `top_k=0` and `top_p=1.0` disable those filters. A `seed` makes sampling reproducible
    whatever else shares the batch: each sampled position's noise is a hash of (seed,
    position, token), so a preempted and recomputed sequence samples the same.
    `constraint`: decode under a grammar, so the output matches it (`Constraint`).
    `logprobs`: report each sampled token's logprob and its `logprobs` most likely
    alternatives (0: the token's alone; None: nothing), from the raw logits (`gpu.logprobs`).

    Penalties and biases (`gpu.penalties`, applied to the raw logits in that module's order;
    each default leaves the logits untouched): `presence_penalty` and `frequency_penalty`
    (OpenAI's, over the completion's tokens), `repetition_penalty` (transformers' and vLLM's,
    over prompt and completion; 1 = off), `logit_bias` ((token id, bias) pairs, added),
    `min_tokens` (EOS and `stop_token_ids` banned, stop strings unchecked, until that many
    tokens are out). `min_p` (after temperature): keep tokens whose probability is at least
    `min_p` times the top token's; 0 = off.

    `prompt_logprobs`: report each prompt token's logprob (from the logits of the position
    before it; the first token has none) and its `prompt_logprobs` most likely alternatives
    (0..20; None: off). Such a request takes no prefix-cache hits while its prompt is unscored
    (a cached block has no logits: its prompt is computed again), though the blocks it computes
    are offered to the cache for others. With it set, `max_new_tokens` may be 0: the request
    scores its prompt and finishes ("length") with no token sampled.

    The text (`gpu.output_processor`): `skip_special_tokens` false keeps special tokens in it;
    `include_stop_str_in_output` keeps the stop string (or stop token) that ended it. With
    `ignore_eos` EOS does not end the output (stop tokens and strings still do).
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    constraint: Constraint | None = None
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    n: int = 1  # choices: the engine runs n sequences over the prompt (`gpu.choices`)
    prompt_logprobs: int | None = None
    # False: never speculate for this request (the engine's speculation is on).
    speculate: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows float32: the limit is argmax anyway.
        return self.temperature < GREEDY_BELOW


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # no KV in the pool (new, or preempted for recompute)
    RUNNING = "running"  # holds blocks; prefilling in chunks or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request's state. Owned by the engine; the scheduler moves it between queues."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0  # larger runs first
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the pool
    block_table: list[int] = field(default_factory=list)  # written by gpu.kv_cache_manager
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens its first admission found in the prefix cache
    # One per output token when `params.logprobs` is set (a recompute samples no kept token
    # again, so the list stays aligned with `output_token_ids`).
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    # With `params.prompt_logprobs`: entry i scores prompt token i + 1 (from position i's
    # logits). Its length is the count of positions recorded, so a recompute after preemption
    # records none twice.
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    # Speculative decoding (`gpu.speculative`): the tokens guessed for this step, checked by
    # its forward after the sequence's last token (not part of its tokens until accepted),
    # and over its life how many were guessed and how many of those accepted.
    draft_token_ids: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def scores_prompt(self) -> bool:
        """It asks for prompt logprobs and some prompt position is still unrecorded."""
        return (
            self.params.prompt_logprobs is not None
            and len(self.prompt_logprobs) < self.num_prompt_tokens - 1
        )

    def unscored_prompt_positions(self, start: int, end: int) -> range:
        """The positions of start .. end - 1 whose logits score a prompt token not yet
        recorded (empty unless the request asks for prompt logprobs)."""
        if self.params.prompt_logprobs is None:
            return range(0)
        return range(max(start, len(self.prompt_logprobs)), min(end, self.num_prompt_tokens - 1))

    def token_slice(self, start: int, end: int) -> list[int]:
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        head = self.prompt_token_ids[start:prompt_len] if start < prompt_len else []
        return head + self.output_token_ids[max(start - prompt_len, 0) : end - prompt_len]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
