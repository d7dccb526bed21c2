"""Prompt logprobs through the engine against transformers (float32): each prompt token's
logprob and top-k are the log-softmax of transformers' logits at the position before it, within
1e-4, the first token having none; across chunked prefill, over a prompt whose prefix is in the
prefix cache (recomputed), under preemption (no position twice); `max_new_tokens=0` scores a
prompt and finishes with no token and no KV held."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpu.engine import Completion, Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import RequestRejected
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from messages.error_codes import ErrorCode
from ops.models.offline import run_all
from tests.tiny_models import ARCHS
from tests.unit.gpu.test_engine import CHUNKY, random_prompts
from tests.unit.gpu.test_engine_logprobs import (
    ATOL,
    K,
    assert_matches,
    assert_top_k,
    engine_and_reference,
    hf_logprobs,
)


def hf_prompt_logprobs(hf, prompt: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """transformers' log-softmax at positions 0 .. P - 2: [P - 1, vocab] float32, row i
    scoring prompt token i + 1."""
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt])).logits[0].float()  # [P, vocab]
    return torch.log_softmax(logits[:-1], dim=-1)


def assert_prompt_matches(completion: Completion, prompt: list[int], reference, k: int) -> None:  # type: ignore[no-untyped-def]
    lp = completion.prompt_logprobs
    assert lp is not None and lp.unscored_first
    n = len(prompt)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_ids) == n
    assert lp.token_logprobs[0] == 0.0 and lp.top_ids[0] == [] and lp.top_logprobs[0] == []
    if n == 1:
        return
    chosen = reference[torch.arange(n - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(torch.tensor(lp.token_logprobs[1:]), chosen, atol=ATOL, rtol=0)
    assert {len(ids) for ids in lp.top_ids[1:]} == {k}
    assert_top_k(lp.top_ids[1:], lp.top_logprobs[1:], reference, k)


@pytest.fixture(scope="module")
def models(tiny_checkpoints: dict[str, Path]) -> dict[str, tuple[LoadedModel, object]]:
    return engine_and_reference(tiny_checkpoints)


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_logprobs_match_transformers(models, arch: str) -> None:  # type: ignore[no-untyped-def]
    model, hf = models[arch]
    # CHUNKY's 48-token steps: the longer prompts span several steps (chunked prefill).
    prompts = random_prompts(model.config.vocab_size, 3, seed=21, low=2, high=110)
    prompts.append([7])  # one token: nothing to score
    params = SamplingParams(max_new_tokens=4, ignore_eos=True, prompt_logprobs=K, logprobs=K)
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    engine = Engine(model, CHUNKY)
    run = run_all(engine, requests)
    for prompt, completion in zip(prompts, run.completions, strict=True):
        assert_prompt_matches(completion, prompt, hf_prompt_logprobs(hf, prompt), K)
        # Generated tokens' logprobs come back in the same read. (LongRoPE: transformers'
        # one pass rotates a prompt that grows past the original length otherwise; the
        # generated logprobs' own tests cover it.)
        if engine.long_rope is None:
            assert_matches(completion, hf_logprobs(hf, prompt, completion.token_ids), K)
        assert completion.prompt_text == model.tokenizer.decode(prompt)


def test_chunked_prefill_contributes_each_chunk(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["llama"]
    prompt = random_prompts(model.config.vocab_size, 1, seed=22, low=90, high=91)[0]
    config = EngineConfig(block_size=4, max_num_batched_tokens=8, num_kv_blocks=256)
    engine = Engine(model, config)
    params = SamplingParams(max_new_tokens=2, ignore_eos=True, prompt_logprobs=3)
    engine.add(EngineRequest("a", prompt, params))
    steps = 0
    done: list[Completion] = []
    while engine.has_work():
        done += engine.step().finished
        steps += 1
    assert steps >= 90 // 8
    assert_prompt_matches(done[0], prompt, hf_prompt_logprobs(hf, prompt), 3)


def test_a_long_chunk_is_scored_in_passes(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["qwen2"]
    prompt = random_prompts(model.config.vocab_size, 1, seed=28, low=150, high=151)[0]
    config = replace(CHUNKY, max_num_batched_tokens=256)  # one chunk: 149 rows, 3 passes
    params = SamplingParams(max_new_tokens=1, prompt_logprobs=4)
    [done] = run_all(Engine(model, config), [EngineRequest("a", prompt, params)]).completions
    assert_prompt_matches(done, prompt, hf_prompt_logprobs(hf, prompt), 4)


def test_a_cached_prefix_is_recomputed_for_its_logprobs(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["qwen2"]
    vocab = model.config.vocab_size
    head = random_prompts(vocab, 1, seed=23, low=40, high=41)[0]
    prompt = [*head, 3, 4, 5, 6, 7]
    engine = Engine(model, CHUNKY)
    warm = run_all(engine, [EngineRequest("warm", head, SamplingParams(max_new_tokens=1))])
    assert warm.completions[0].cached_tokens == 0
    params = SamplingParams(max_new_tokens=2, ignore_eos=True, prompt_logprobs=K)
    [scored] = run_all(engine, [EngineRequest("scored", prompt, params)]).completions
    assert scored.cached_tokens == 0  # recomputed: a cached block has no logits
    assert_prompt_matches(scored, prompt, hf_prompt_logprobs(hf, prompt), K)
    # The blocks it computed are cached for others.
    plain = SamplingParams(max_new_tokens=2, ignore_eos=True)
    [after] = run_all(engine, [EngineRequest("after", prompt, plain)]).completions
    assert after.cached_tokens > 0
    assert after.token_ids == scored.token_ids


def test_preemption_records_no_position_twice(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["llama"]
    prompts = random_prompts(model.config.vocab_size, 8, seed=24, low=30, high=60)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True, prompt_logprobs=2)
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    tight = EngineConfig(
        block_size=4, max_num_batched_tokens=48, num_kv_blocks=40, max_model_len=160
    )
    run = run_all(Engine(model, tight), requests)
    assert sum(c.num_preemptions for c in run.completions) > 0
    for prompt, completion in zip(prompts, run.completions, strict=True):
        assert_prompt_matches(completion, prompt, hf_prompt_logprobs(hf, prompt), 2)


def test_scoring_with_no_new_tokens(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["gpt2"]
    prompts = random_prompts(model.config.vocab_size, 3, seed=25, low=5, high=70)
    params = SamplingParams(max_new_tokens=0, prompt_logprobs=0)
    engine = Engine(model, CHUNKY)
    other = EngineRequest("gen", prompts[0], SamplingParams(max_new_tokens=5, ignore_eos=True))
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    run = run_all(engine, [*requests, other])
    for prompt, completion in zip(prompts, run.completions[:-1], strict=True):
        assert completion.token_ids == [] and completion.text == ""
        assert completion.finish_reason == "length"
        assert completion.first_token_time is None
        assert_prompt_matches(completion, prompt, hf_prompt_logprobs(hf, prompt), 0)
    assert len(run.completions[-1].token_ids) == 5
    assert engine.blocks_used == 0 and not engine.sequences


def test_n_choices_carry_the_requests_prompt_logprobs(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["llama"]
    prompt = random_prompts(model.config.vocab_size, 1, seed=26, low=30, high=31)[0]
    params = SamplingParams(
        max_new_tokens=4, ignore_eos=True, prompt_logprobs=1, n=3, temperature=1.0, seed=5
    )
    [done] = run_all(Engine(model, CHUNKY), [EngineRequest("a", prompt, params)]).completions
    assert len(done.choices) == 3
    assert_prompt_matches(done, prompt, hf_prompt_logprobs(hf, prompt), 1)


def test_no_prompt_logprobs_unless_asked(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    params = SamplingParams(max_new_tokens=3, ignore_eos=True, logprobs=1)
    [done] = run_all(Engine(model, CHUNKY), [EngineRequest("a", [5, 6, 7], params)]).completions
    assert done.prompt_logprobs is None and done.prompt_text is None


@pytest.mark.parametrize(
    ("params", "code"),
    [
        (SamplingParams(max_new_tokens=0), ErrorCode.INVALID_MAX_TOKENS),
        (SamplingParams(max_new_tokens=-1, prompt_logprobs=0), ErrorCode.INVALID_MAX_TOKENS),
        (SamplingParams(prompt_logprobs=21), ErrorCode.INVALID_SAMPLING_PARAMS),
        (SamplingParams(prompt_logprobs=-1), ErrorCode.INVALID_SAMPLING_PARAMS),
    ],
)
def test_the_engine_refuses(models, params: SamplingParams, code: ErrorCode) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    with pytest.raises(RequestRejected) as refused:
        Engine(model, CHUNKY).add(EngineRequest("a", [5, 6], params))
    assert refused.value.code is code


def test_static_decode_path_unchanged(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["llama"]
    prompts = random_prompts(model.config.vocab_size, 2, seed=27, low=10, high=50)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True, prompt_logprobs=2)
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    run = run_all(Engine(model, replace(CHUNKY, decode_graphs="eager")), requests)
    for prompt, completion in zip(prompts, run.completions, strict=True):
        assert_prompt_matches(completion, prompt, hf_prompt_logprobs(hf, prompt), 2)


def test_only_the_scoring_requests_rows_are_added(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    engine = Engine(model, CHUNKY)
    plain = SamplingParams(max_new_tokens=2)
    engine.add(EngineRequest("plain", [5, 6, 7, 8], plain))
    step = engine.backend.prepare(engine.scheduler.schedule())
    assert step.inputs is not None and not step.scored
    assert step.inputs.logits_rows.tolist() == [3]  # no scoring request: the sampled row alone

    engine = Engine(model, CHUNKY)
    engine.add(EngineRequest("plain", [5, 6, 7, 8], plain))
    engine.add(EngineRequest("scored", [9, 10, 11], replace(plain, prompt_logprobs=1)))
    step = engine.backend.prepare(engine.scheduler.schedule())
    assert step.inputs is not None
    # The sampled rows keep their places (the prompts' last tokens, rows 3 and 6); the scoring
    # prompt's positions 0 and 1 (rows 4 and 5) follow them.
    assert step.inputs.logits_rows.tolist() == [3, 6, 4, 5]
    assert [(c.seq.request_id, r) for c, r in step.scored.items()] == [("scored", range(0, 2))]


@pytest.mark.slow
def test_smollm2_prompt_logprobs_match_transformers(smollm2_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = load_model(smollm2_path)
    hf = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()
    texts = ["The capital of France is Paris.", "def fibonacci(n):", "Kafka topics carry"]
    prompts = model.tokenizer.encode_batch(texts)
    params = SamplingParams(max_new_tokens=0, prompt_logprobs=K)
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    run = run_all(Engine(model, EngineConfig(max_num_batched_tokens=8)), requests)
    for prompt, completion in zip(prompts, run.completions, strict=True):
        assert completion.token_ids == []
        assert_prompt_matches(completion, prompt, hf_prompt_logprobs(hf, prompt), K)
