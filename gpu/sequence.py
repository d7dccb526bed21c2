"""A request inside the engine: its tokens, sampling parameters and progress.

Pure Python (no torch): the scheduler and its tests work on these objects alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

GREEDY_BELOW = 1e-5  # temperatures under this are greedy


@dataclass(frozen=True)
class JsonConstraint:
    """The output must be JSON matching `schema` (JSON Schema as compact text, which is what
    the engine's grammar cache is keyed by). `strict`: refuse a schema keyword the grammar
    cannot enforce rather than ignore it."""

    schema: str
    strict: bool = False


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. The default is greedy: temperature 0.

    `top_k=0` and `top_p=1.0` disable those filters. A `seed` makes sampling reproducible
    whatever else shares the batch: each sampled position's noise is a hash of (seed,
    position, token), so a preempted and recomputed sequence samples the same.
    `json`: decode under a grammar, so the output is JSON matching that schema.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    json: JsonConstraint | None = None

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

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def token_slice(self, start: int, end: int) -> list[int]:
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        head = self.prompt_token_ids[start:prompt_len] if start < prompt_len else []
        return head + self.output_token_ids[max(start - prompt_len, 0) : end - prompt_len]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
