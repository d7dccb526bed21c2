"""Prefix caching changes no answer: greedy and seeded outputs are the same with it and
without it, on both attention paths, and results say how many prompt tokens it served."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from ops.models.offline import OfflineRun, run_all
from tests.unit.gpu.test_engine import ATTENTIONS, random_prompts

GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)


def seeded(i: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=12, temperature=0.8, top_k=40, seed=7 + i, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama(tiny_checkpoints: dict[str, Path]) -> LoadedModel:
    return load_model(tiny_checkpoints["llama"])


def shared_prefix_requests(vocab: int, count: int) -> list[EngineRequest]:
    """`count` prompts: one 37-token system prompt, then different questions (1-20 tokens)."""
    system = random_prompts(vocab, 1, seed=11, low=37, high=38)[0]
    questions = random_prompts(vocab, count, seed=12, low=1, high=20)
    return [
        EngineRequest(f"q{i}", system + q, GREEDY if i % 2 else seeded(i))
        for i, q in enumerate(questions)
    ]


def first_then_rest(engine: Engine, requests: list[EngineRequest]) -> OfflineRun:
    """The first request alone (it fills the cache), then the rest in one batch."""
    first = run_all(engine, requests[:1])
    rest = run_all(engine, requests[1:])
    return OfflineRun(first.completions + rest.completions, first.steps + rest.steps)


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_outputs_are_the_same_with_and_without_prefix_caching(
    tiny_llama: LoadedModel, attention: str
) -> None:
    config = ATTENTIONS[attention]
    requests = shared_prefix_requests(tiny_llama.config.vocab_size, 10)
    cached = first_then_rest(Engine(tiny_llama, config), requests)
    plain = first_then_rest(Engine(tiny_llama, replace(config, prefix_caching=False)), requests)
    for a, b in zip(cached.completions, plain.completions, strict=True):
        assert a.token_ids == b.token_ids, a.request_id
    block = config.block_size
    assert cached.completions[0].cached_tokens == 0
    # 37 shared tokens: 9 full blocks of 4 (the last token of a prompt is always computed).
    assert all(c.cached_tokens == 36 // block * block for c in cached.completions[1:])
    assert all(c.cached_tokens == 0 for c in plain.completions)
    hit = sum(s.cached_prompt_tokens for s in cached.steps)
    prompt = sum(s.prompt_tokens for s in cached.steps)
    assert prompt == sum(len(r.prompt_token_ids) for r in requests)
    assert hit == 36 * 9
    assert sum(s.num_prefill_tokens for s in cached.steps) < sum(
        s.num_prefill_tokens for s in plain.steps
    )


def test_tight_pool_preemption_with_caching_gives_the_same_tokens(
    tiny_llama: LoadedModel,
) -> None:
    requests = shared_prefix_requests(tiny_llama.config.vocab_size, 12)
    tight = EngineConfig(
        block_size=4, max_num_batched_tokens=48, num_kv_blocks=40, max_model_len=80
    )
    cached = run_all(Engine(tiny_llama, tight), requests)
    plain = run_all(Engine(tiny_llama, replace(tight, prefix_caching=False)), requests)
    assert sum(c.num_preemptions for c in plain.completions) > 0
    for a, b in zip(cached.completions, plain.completions, strict=True):
        assert a.token_ids == b.token_ids, a.request_id


def test_prefix_caching_is_off_where_a_block_depends_on_more_than_its_tokens(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from tests.tiny_models import build_tiny_checkpoint

    assert Engine(load_model(tiny_checkpoints["llama"])).prefix_caching
    off = Engine(load_model(tiny_checkpoints["llama"]), EngineConfig(prefix_caching=False))
    assert not off.prefix_caching and off.scheduler.prefix_key is None
    # LongRoPE: a sequence past the original length re-rotates its whole context.
    assert not Engine(load_model(tiny_checkpoints["phi3"])).prefix_caching
    # Every layer local: blocks behind the window are released, leaving holes in the chain.
    local = load_model(build_tiny_checkpoint("gemma3_local", tmp_path / "gemma3_local"))
    assert not Engine(local, EngineConfig(max_model_len=256)).prefix_caching
