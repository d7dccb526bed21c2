"""Batching must not change answers: alone or among 31 others, preempted or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from ops.models.offline import run_all
from tests.unit.gpu.test_engine import CHUNKY, engine_tokens, random_prompts

GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)


def seeded(i: int) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=1000 + i, ignore_eos=True
    )


@pytest.fixture(scope="module")
def tiny_llama(tiny_checkpoints: dict[str, Path]) -> LoadedModel:
    return load_model(tiny_checkpoints["llama"])


def alone_vs_batched(
    model: LoadedModel, prompts: list[list[int]], params: list[SamplingParams]
) -> None:
    together = run_all(
        Engine(model, CHUNKY),
        [EngineRequest(str(i), p, params[i]) for i, p in enumerate(prompts)],
    )
    for i, prompt in enumerate(prompts):
        alone = run_all(Engine(model, CHUNKY), [EngineRequest("a", prompt, params[i])])
        assert alone.completions[0].token_ids == together.completions[i].token_ids, f"prompt {i}"


def test_greedy_alone_equals_in_batch_of_32(tiny_llama: LoadedModel) -> None:
    prompts = random_prompts(tiny_llama.config.vocab_size, 32, seed=3)
    alone_vs_batched(tiny_llama, prompts, [GREEDY] * 32)


def test_seeded_sampling_alone_equals_in_batch_of_32(tiny_llama: LoadedModel) -> None:
    prompts = random_prompts(tiny_llama.config.vocab_size, 32, seed=4)
    alone_vs_batched(tiny_llama, prompts, [seeded(i) for i in range(32)])


def test_same_seed_same_tokens_different_seed_different_tokens(tiny_llama: LoadedModel) -> None:
    prompt = random_prompts(tiny_llama.config.vocab_size, 1, seed=5)[0]
    a = engine_tokens(tiny_llama, [prompt, prompt], seeded(1))
    b = engine_tokens(tiny_llama, [prompt], seeded(2))
    assert a[0] == a[1]
    assert a[0] != b[0]


def test_preempted_sequences_recompute_to_the_same_tokens(tiny_llama: LoadedModel) -> None:
    prompts = random_prompts(tiny_llama.config.vocab_size, 12, seed=6, low=20, high=60)
    params = [GREEDY if i % 2 else seeded(i) for i in range(12)]
    requests = [EngineRequest(str(i), p, params[i]) for i, p in enumerate(prompts)]
    roomy = run_all(Engine(tiny_llama, CHUNKY), requests)
    # 40 blocks of 4 tokens: room for about two sequences at a time, so decodes preempt.
    tight = run_all(
        Engine(
            tiny_llama,
            EngineConfig(
                block_size=4, max_num_batched_tokens=48, num_kv_blocks=40, max_model_len=160
            ),
        ),
        requests,
    )
    assert sum(c.num_preemptions for c in tight.completions) > 0
    for a, b in zip(roomy.completions, tight.completions, strict=True):
        assert a.token_ids == b.token_ids


@pytest.mark.slow
def test_smollm2_greedy_alone_equals_in_batch(smollm2_path: Path) -> None:
    model = load_model(smollm2_path)
    texts = [
        f"Question {i}: name {i % 5 + 1} things that are {'red' if i % 2 else 'fast'}."
        * (1 + i % 4)
        for i in range(32)
    ]
    prompts = model.tokenizer.encode_batch(texts)
    params = [SamplingParams(max_new_tokens=8, ignore_eos=True)] * 32
    alone_vs_batched(model, prompts, params)


def test_what_one_request_leaves_in_the_pool_never_reaches_another(tiny_llama: LoadedModel) -> None:
    prompts = random_prompts(tiny_llama.config.vocab_size, 6, seed=8, low=5, high=40)
    requests = [EngineRequest(str(i), p, GREEDY) for i, p in enumerate(prompts)]
    clean = run_all(Engine(tiny_llama, CHUNKY), requests)
    engine = Engine(tiny_llama, CHUNKY)
    engine.kv.cache[:, :, 1:] = float("nan")  # every block but the padding one: garbage
    poisoned = run_all(engine, requests)
    for a, b in zip(clean.completions, poisoned.completions, strict=True):
        assert a.token_ids == b.token_ids
