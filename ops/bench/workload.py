"""The seeded workload every benchmark runs (`bench engine`, `bench pipeline`, through Kafka),
and the host load each reports beside its figures."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu.engine import Engine


@dataclass(frozen=True)
class BenchOptions:
    requests: int = 64
    seed: int = 0
    min_prompt: int = 16
    max_prompt: int = 256
    min_output: int = 16
    max_output: int = 256
    sequential_requests: int = 8  # transformers batch-1 runs on this many of the requests
    static_batch: int = 16
    static_batches: int = 2  # transformers static batching runs on this many whole batches
    gemm_size: int = 2048
    profile_dir: Path | None = None
    profile_decode_steps: int = 8


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_new_tokens: int


# -- workload ------------------------------------------------------------------------------


def make_workload(engine: Engine, options: BenchOptions) -> list[BenchRequest]:
    """Seeded prompts of random non-special token ids and uniform output lengths."""
    o = options
    if not 1 <= o.min_prompt <= o.max_prompt or not 1 <= o.min_output <= o.max_output:
        raise ValueError("need 1 ≤ min ≤ max for both prompt and output lengths")
    if o.max_prompt + o.max_output > engine.max_model_len:
        raise ValueError(
            f"max prompt ({o.max_prompt}) + max output ({o.max_output}) exceeds the engine's "
            f"max_model_len {engine.max_model_len}"
        )
    if o.requests < 1:
        raise ValueError("--requests must be at least 1")
    allowed = allowed_token_ids(engine)
    rng = random.Random(o.seed)
    return [
        BenchRequest(
            prompt_token_ids=rng.choices(allowed, k=rng.randint(o.min_prompt, o.max_prompt)),
            max_new_tokens=rng.randint(o.min_output, o.max_output),
        )
        for _ in range(o.requests)
    ]


def allowed_token_ids(engine: Engine) -> list[int]:
    """The token ids a random prompt may use: every id but special, EOS and BOS ones."""
    model = engine.model
    inner = model.tokenizer.inner
    special = {*inner.get_added_tokens_decoder(), *model.eos_token_ids}
    if model.config.bos_token_id is not None:
        special.add(model.config.bos_token_id)
    vocab = min(model.config.vocab_size, model.tokenizer.vocab_size)
    return [t for t in range(vocab) if t not in special]


def host_load() -> float | None:
    """The 1-minute load average: above the CPU count, other work competed for the CPUs."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
