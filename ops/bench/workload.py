"""The seeded workload every benchmark runs, and the requests made from it: for an engine in
this process (`engine_requests`) or for a worker over Kafka (`wire_requests`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpu.engine import EngineRequest
from gpu.sequence import SamplingParams
from messages.request import GenerateRequest

if TYPE_CHECKING:
    from gpu.engine import Engine


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_new_tokens: int


@dataclass(frozen=True)
class Workload:
    """Uniform random prompt and output lengths, random non-special token ids, one seed."""

    requests: int = 64
    seed: int = 0
    min_prompt: int = 16
    max_prompt: int = 256
    min_output: int = 16
    max_output: int = 256

    def prefill_heavy(self) -> Workload:
        """The same requests and seed, prompts of 256–1,024 tokens and outputs of 16–128: about
        nine prompt tokens to an output token, where prefill's products decide the rate."""
        return replace(self, min_prompt=256, max_prompt=1024, min_output=16, max_output=128)

    def with_seed(self, seed: int, requests: int | None = None) -> Workload:
        return replace(self, seed=seed, requests=self.requests if requests is None else requests)

    def fixed(self, requests: int, prompt: int, output: int) -> Workload:
        """`requests` requests of exactly `prompt` prompt and `output` new tokens."""
        return replace(self, requests=requests, min_prompt=prompt, max_prompt=prompt,
                       min_output=output, max_output=output)  # fmt: skip

    def describe(self, built: Sequence[BenchRequest]) -> dict[str, Any]:
        return {
            "seed": self.seed, "requests": self.requests,
            "prompt_len_range": [self.min_prompt, self.max_prompt],
            "output_len_range": [self.min_output, self.max_output],
            "prompt_tokens": sum(len(r.prompt_token_ids) for r in built),
            "output_tokens": sum(r.max_new_tokens for r in built),
        }  # fmt: skip

    def build(self, engine: Engine) -> list[BenchRequest]:
        """The seeded requests; ValueError when they cannot fit the engine."""
        if not (
            1 <= self.min_prompt <= self.max_prompt and 1 <= self.min_output <= self.max_output
        ):
            raise ValueError("need 1 ≤ min ≤ max for both prompt and output lengths")
        if self.max_prompt + self.max_output > engine.max_model_len:
            raise ValueError(
                f"max prompt ({self.max_prompt}) + max output ({self.max_output}) exceeds the "
                f"engine's max_model_len {engine.max_model_len}"
            )
        if self.requests < 1:
            raise ValueError("--requests must be at least 1")
        allowed, rng = allowed_token_ids(engine), random.Random(self.seed)
        return [
            BenchRequest(rng.choices(allowed, k=rng.randint(self.min_prompt, self.max_prompt)),
                         rng.randint(self.min_output, self.max_output))
            for _ in range(self.requests)
        ]  # fmt: skip


def allowed_token_ids(engine: Engine) -> list[int]:
    """The token ids a random prompt may use: every id but special, EOS and BOS ones."""
    model = engine.model
    special = {*model.tokenizer.inner.get_added_tokens_decoder(), *model.eos_token_ids}
    if model.config.bos_token_id is not None:
        special.add(model.config.bos_token_id)
    vocab = min(model.config.vocab_size, model.tokenizer.vocab_size)
    return [t for t in range(vocab) if t not in special]


def random_prompts(engine: Engine, count: int, length: int, seed: int) -> list[list[int]]:
    rng, allowed = random.Random(seed), allowed_token_ids(engine)
    return [rng.choices(allowed, k=length) for _ in range(count)]


def engine_requests(
    workload: Sequence[BenchRequest], prefix: str, *, ignore_eos: bool = True
) -> list[EngineRequest]:
    """Greedy requests; with `ignore_eos` each generates exactly its asked length (a request on
    the wire cannot ignore EOS: runs compared with a worker keep it)."""
    return [
        EngineRequest(f"{prefix}{i}", r.prompt_token_ids,
                      SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=ignore_eos))
        for i, r in enumerate(workload)
    ]  # fmt: skip


def wire_requests(workload: Sequence[BenchRequest], prefix: str) -> list[GenerateRequest]:
    return [
        GenerateRequest(id=f"{prefix}{i}", prompt_token_ids=r.prompt_token_ids,
                        max_new_tokens=r.max_new_tokens)
        for i, r in enumerate(workload)
    ]  # fmt: skip
