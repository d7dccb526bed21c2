"""What goes into the engine and what comes out: `EngineRequest` in (`Engine.add`), a
`StepOutput` per `Engine.step` (new tokens, finished `Completion`s, `StepStats`).

Plain values, apart from the engine's step: callers that only make requests and read results
(the actors, benchmarks, the echo engine) need nothing else of it. `gpu.engine` exports them
too, where callers have always found them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu.logprobs import CompletionLogprobs, TokenLogprob
from gpu.sequence import SamplingParams


@dataclass(frozen=True)
class EmbedJob:
    """What an embedding request asks of an encoder engine (`gpu.encoder`): one vector per
    input, each input's tokens final (task prompt, special tokens and truncation applied by the
    caller). `dimensions`: keep each vector's first values and normalize again (Matryoshka);
    None: the model's full width."""

    inputs: tuple[Sequence[int], ...]
    dimensions: int | None = None


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: Sequence[int]  # an embedding request's: its inputs' tokens, concatenated
    params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0  # larger runs first
    arrival_time: float | None = None  # monotonic seconds; now when None
    embed: EmbedJob | None = None  # an embedding request (only an encoder engine runs one)


@dataclass(frozen=True)
class Completion:
    """A finished request: its tokens, text, why it stopped, and when things happened."""

    request_id: str
    prompt_tokens: int
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | ...
    arrival_time: float
    first_token_time: float | None
    finish_time: float
    num_preemptions: int
    num_kv_blocks: int = 0  # KV-cache blocks it held when it finished (its peak)
    cached_tokens: int = 0  # prompt tokens whose K/V the prefix cache served
    # One entry per token of `token_ids` when the request asked for logprobs (`gpu.logprobs`).
    logprobs: CompletionLogprobs | None = None
    # When the request asked for prompt logprobs: one entry per prompt token (the first a
    # placeholder: `unscored_first`), and the prompt decoded as the text is (for echo).
    # With n > 1 they are the request's, on every choice alike.
    prompt_logprobs: CompletionLogprobs | None = None
    prompt_text: str | None = None
    # Speculative decoding: tokens guessed for it, and how many of them the model accepted.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    # n > 1: every choice in order (the fields above are the first's; `gpu.choices.merge`).
    choices: tuple[Completion, ...] = ()
    # An embedding request's vectors (`EngineRequest.embed`), one per input in order: float32
    # numpy arrays [dimensions], normalized as the model's pipeline says. Empty otherwise.
    embeddings: tuple[Any, ...] = ()

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_time is None:
            return None
        return (self.first_token_time - self.arrival_time) * 1e3

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token_time is None or len(self.token_ids) < 2:
            return None
        return (self.finish_time - self.first_token_time) * 1e3 / (len(self.token_ids) - 1)

    @property
    def total_ms(self) -> float:
        return (self.finish_time - self.arrival_time) * 1e3


@dataclass(frozen=True)
class StepStats:
    start_ns: int  # wall clock (time.time_ns), for spans recorded after the fact
    end_ns: int
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    num_waiting: int
    num_running: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_blocks_cached: int = 0  # unreferenced blocks kept for their prefix
    prompt_tokens: int = 0  # of requests admitted this step for the first time
    cached_prompt_tokens: int = 0  # of those, served by the prefix cache
    # Speculative decoding: the proposer that guessed (None: no sequence speculated this
    # step), the sequences verified, tokens guessed and tokens of those accepted.
    proposer: str | None = None
    num_verified_seqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    # The host's wall time in the step's model forward call: on a CPU the forward itself; on
    # CUDA, launching it (the device runs it asynchronously). 0 for a step with no batch.
    forward_ns: int = 0

    @property
    def host_ns(self) -> int:
        """The step's wall time outside the forward call: scheduling, building inputs,
        sampling, collecting. On a CPU the forward waits for all of it: it is the step's host
        overhead."""
        return max(0, self.end_ns - self.start_ns - self.forward_ns)


@dataclass(frozen=True)
class StepOutput:
    new_tokens: list[tuple[str, int]]  # (request_id, token id), in the order sampled
    finished: list[Completion]
    stats: StepStats
    # the logprobs of the new tokens of the requests that asked for them, in order, by id
    new_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
