"""Logprobs through the engine against transformers (float32): each generated token's logprob
and its top-k are the log-softmax of transformers' logits at that position, within 1e-4; they
are the raw logits' (temperature does not change them); preemption and recompute keep them."""

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
from tests.unit.gpu.test_engine import CHUNKY, hf_greedy, random_prompts

ATOL = 1e-4
K = 5


def hf_logprobs(hf, prompt: list[int], tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """transformers' log-softmax at each generated position: [len(tokens), vocab] float32."""
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + tokens])).logits[0].float()  # [positions, vocab]
    return torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)


def assert_matches(completion: Completion, reference: torch.Tensor, k: int) -> None:
    """`completion`'s logprobs are `reference`'s ([tokens, vocab]) at its tokens and top k."""
    lp = completion.logprobs
    assert lp is not None
    n = len(completion.token_ids)
    assert len(lp.token_logprobs) == len(lp.top_ids) == len(lp.tokens) == n
    chosen = reference[torch.arange(n), torch.tensor(completion.token_ids)]
    torch.testing.assert_close(torch.tensor(lp.token_logprobs), chosen, atol=ATOL, rtol=0)
    assert_top_k(lp.top_ids, lp.top_logprobs, reference, k)


def assert_top_k(
    top_ids: list[list[int]], top_logprobs: list[list[float]], reference: torch.Tensor, k: int
) -> None:
    """Each row's top k values are `reference`'s row's, and each id carries its own value
    (near-ties may order the ids differently)."""
    values = reference.topk(k, dim=-1).values
    torch.testing.assert_close(torch.tensor(top_logprobs), values, atol=ATOL, rtol=0)
    at_ids = reference.gather(-1, torch.tensor(top_ids))
    torch.testing.assert_close(torch.tensor(top_logprobs), at_ids, atol=ATOL, rtol=0)


def engine_and_reference(
    tiny_checkpoints: dict[str, Path],
) -> dict[str, tuple[LoadedModel, object]]:
    """Each tiny architecture loaded by the engine and by transformers (float32)."""
    from transformers import AutoModelForCausalLM

    return {
        arch: (
            load_model(path),
            # eager: transformers 5.17's default SDPA path drops Gemma 2's attention soft cap
            # (0.044 off in logprob; 5.24 runs Gemma 2 eagerly itself)
            AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, attn_implementation="eager"
            ).eval(),
        )
        for arch, path in tiny_checkpoints.items()
    }


@pytest.fixture(scope="module")
def models(tiny_checkpoints: dict[str, Path]) -> dict[str, tuple[LoadedModel, object]]:
    return engine_and_reference(tiny_checkpoints)


# The dynamic path, and the static decode path CUDA graphs replay (run eagerly here).
PATHS = {"dynamic": CHUNKY, "static": replace(CHUNKY, decode_graphs="eager")}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_logprobs_match_transformers(models, arch: str, path: str) -> None:  # type: ignore[no-untyped-def]
    model, hf = models[arch]
    prompts = random_prompts(model.config.vocab_size, 3, seed=11, high=70)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=K)
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    run = run_all(Engine(model, PATHS[path]), requests)
    for prompt, completion in zip(prompts, run.completions, strict=True):
        assert completion.token_ids == hf_greedy(hf, prompt, 12)
        assert_matches(completion, hf_logprobs(hf, prompt, completion.token_ids), K)
        assert completion.logprobs is not None
        # Greedy: the token is the most likely one.
        assert [ids[0] for ids in completion.logprobs.top_ids] == completion.token_ids


def test_logprobs_are_the_raw_logits_whatever_the_temperature(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["llama"]
    prompt = random_prompts(model.config.vocab_size, 1, seed=12, low=20, high=21)[0]
    hot = SamplingParams(max_new_tokens=10, temperature=3.0, seed=7, ignore_eos=True, logprobs=K)
    cold = SamplingParams(max_new_tokens=10, temperature=0.3, seed=7, ignore_eos=True, logprobs=K)
    for params in (hot, cold):
        completion = run_all(Engine(model, CHUNKY), [EngineRequest("a", prompt, params)])
        [done] = completion.completions
        assert_matches(done, hf_logprobs(hf, prompt, done.token_ids), K)


def test_mixed_batch_rows_get_what_they_ask(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["qwen2"]
    prompts = random_prompts(model.config.vocab_size, 4, seed=13, high=60)
    asks = [None, 0, 3, 20]
    requests = [
        EngineRequest(str(i), p, SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=k))
        for i, (p, k) in enumerate(zip(prompts, asks, strict=True))
    ]
    run = run_all(Engine(model, CHUNKY), requests)
    assert run.completions[0].logprobs is None
    for prompt, k, completion in zip(prompts[1:], asks[1:], run.completions[1:], strict=True):
        assert completion.logprobs is not None
        assert {len(ids) for ids in completion.logprobs.top_ids} == {k}
        assert_matches(completion, hf_logprobs(hf, prompt, completion.token_ids), k)


def test_preempted_sequences_keep_their_logprobs(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    prompts = random_prompts(model.config.vocab_size, 10, seed=14, low=20, high=60)
    params = [
        SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=3, temperature=0.8, seed=i)
        if i % 2
        else SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=3)
        for i in range(10)
    ]
    requests = [EngineRequest(str(i), p, params[i]) for i, p in enumerate(prompts)]
    roomy = run_all(Engine(model, CHUNKY), requests)
    tight_config = EngineConfig(
        block_size=4, max_num_batched_tokens=48, num_kv_blocks=40, max_model_len=160
    )
    tight = run_all(Engine(model, tight_config), requests)
    assert sum(c.num_preemptions for c in tight.completions) > 0
    for a, b in zip(roomy.completions, tight.completions, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs is not None and b.logprobs is not None
        assert len(b.logprobs.token_logprobs) == len(b.token_ids)
        assert a.logprobs.top_ids == b.logprobs.top_ids
        torch.testing.assert_close(
            torch.tensor(a.logprobs.token_logprobs), torch.tensor(b.logprobs.token_logprobs)
        )


def test_token_texts_are_the_tokenizers(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    params = SamplingParams(max_new_tokens=5, ignore_eos=True, logprobs=2)
    [done] = run_all(Engine(model, CHUNKY), [EngineRequest("a", [5, 6, 7], params)]).completions
    assert done.logprobs is not None
    decode = model.tokenizer.decode
    assert done.logprobs.tokens == [decode([t], skip_special_tokens=False) for t in done.token_ids]
    assert done.logprobs.top_tokens[0] == [
        decode([t], skip_special_tokens=False) for t in done.logprobs.top_ids[0]
    ]


def test_no_logprobs_unless_asked(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    [done] = run_all(Engine(model, CHUNKY), [EngineRequest("a", [5, 6, 7], params)]).completions
    assert done.logprobs is None


@pytest.mark.parametrize("k", [-1, 21])
def test_the_engine_refuses_k_outside_0_to_20(models, k: int) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    engine = Engine(model, CHUNKY)
    with pytest.raises(RequestRejected) as refused:
        engine.add(EngineRequest("a", [5, 6], SamplingParams(logprobs=k)))
    assert refused.value.code is ErrorCode.INVALID_SAMPLING_PARAMS


@pytest.mark.slow
def test_smollm2_greedy_logprobs_match_transformers(smollm2_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = load_model(smollm2_path)
    hf = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()
    texts = ["The capital of France is", "def fibonacci(n):", "Kafka topics carry"]
    prompts = model.tokenizer.encode_batch(texts)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True, logprobs=K)
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    run = run_all(Engine(model, EngineConfig(max_num_batched_tokens=64)), requests)
    for prompt, completion in zip(prompts, run.completions, strict=True):
        assert completion.token_ids == hf_greedy(hf, prompt, 8)
        assert_matches(completion, hf_logprobs(hf, prompt, completion.token_ids), K)
