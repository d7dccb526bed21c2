"""The engine with speculation on: the same output as without, on every architecture.

Greedy requests give transformers' tokens (and its own prompt-lookup generation's); seeded
sampled requests give the very tokens they give without speculation; stop strings, stop
tokens, logprobs, penalties, grammars, `n` > 1, prefix caching, preemption and cancel all
behave as without. Prompts repeat a random segment, so prompt lookup finds matches and some
guesses are kept, some not (asserted: the tests would prove nothing otherwise).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import Constraint, SamplingParams
from ops.models.offline import OfflineRun, run_all
from tests.tiny_models import ARCHS
from tests.unit.gpu.test_engine import ATTENTIONS, attention_config, hf_greedy

NGRAM = "ngram:k=4,n=1-3"


def repeating_prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    """A random segment three times, then its start: the continuation is easy to guess."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(count):
        length = int(torch.randint(3, 24, (1,), generator=g))
        segment = torch.randint(0, vocab, (length,), generator=g).tolist()
        prompts.append(segment * 3 + segment[: i % length + 1])
    return prompts


def run(
    model: LoadedModel,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    config: EngineConfig,
    speculative: str | None,
) -> OfflineRun:
    engine = Engine(model, replace(config, speculative=speculative))
    each = params if isinstance(params, list) else [params] * len(prompts)
    requests = [
        EngineRequest(str(i), p, q) for i, (p, q) in enumerate(zip(prompts, each, strict=True))
    ]
    return run_all(engine, requests)


def tokens(result: OfflineRun) -> list[list[int]]:
    return [c.token_ids for c in result.completions]


def accepted(result: OfflineRun) -> tuple[int, int]:
    """(guesses kept, guesses made) over the run."""
    done = result.completions
    return sum(c.accepted_draft_tokens for c in done), sum(c.draft_tokens for c in done)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints: dict[str, Path]) -> dict[str, tuple[LoadedModel, object]]:
    from transformers import AutoModelForCausalLM

    return {
        arch: (
            load_model(path),
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
        )
        for arch, path in tiny_checkpoints.items()
    }


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_transformers_with_speculation(tiny, arch: str, attention: str) -> None:  # type: ignore[no-untyped-def]
    model, hf = tiny[arch]
    prompts = repeating_prompts(model.config.vocab_size, 6, seed=1)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    result = run(model, prompts, params, attention_config(attention), NGRAM)
    for prompt, ours in zip(prompts, tokens(result), strict=True):
        assert ours == hf_greedy(hf, prompt, 20), f"prompt of {len(prompt)} tokens diverged"
    assert accepted(result)[1] > 0, "nothing was guessed: the test checks nothing"


@pytest.mark.parametrize("arch", ("llama", "qwen2", "gemma3"))
def test_transformers_prompt_lookup_generation_agrees(tiny, arch: str) -> None:  # type: ignore[no-untyped-def]
    """transformers' own prompt-lookup decoding, greedy, as a second reference."""
    model, hf = tiny[arch]
    hf.generation_config.eos_token_id = None
    for prompt in repeating_prompts(model.config.vocab_size, 3, seed=2):
        out = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=16,
            do_sample=False,
            prompt_lookup_num_tokens=4,
            pad_token_id=0,
        )
        theirs = [int(t) for t in out[0, len(prompt) :]]
        alone = replace(attention_config("native-paged"), max_num_seqs=1)
        params = SamplingParams(max_new_tokens=16, ignore_eos=True)
        assert tokens(run(model, [prompt], params, alone, NGRAM)) == [theirs]


@pytest.mark.parametrize("arch", ("llama", "gemma2", "qwen3_moe", "phi3"))
def test_seeded_sampling_gives_the_same_tokens(tiny, arch: str) -> None:  # type: ignore[no-untyped-def]
    """The verification samples each position with the request's own (seed, position) noise:
    a seeded request's tokens are those it gets without speculation."""
    model, _ = tiny[arch]
    prompts = repeating_prompts(model.config.vocab_size, 8, seed=3)
    config = attention_config("native-paged")
    params = [
        SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=t, seed=s, top_k=k)
        for t, s, k in [(0.05, 1, 0), (0.1, 2, 20), (0.3, 3, 0), (0.2, 4, 5)] * 2
    ]
    with_spec = run(model, prompts, params, config, NGRAM)
    assert tokens(with_spec) == tokens(run(model, prompts, params, config, None))
    assert accepted(with_spec)[0] > 0


class Oracle:
    """Guesses the target's most likely continuation after each possible first token (what
    a good draft model does): guesses are often kept, and often not."""

    name = "oracle"

    def __init__(self, guesses: dict[int, list[int]]) -> None:
        self.guesses = guesses

    def propose(self, requests):  # type: ignore[no-untyped-def]
        return [self.guesses.get(r.token_ids[-1], [])[: r.max_tokens] for r in requests]

    def release(self, seq_id: str) -> None:
        pass


def test_sampled_tokens_are_distributed_as_the_targets(tiny) -> None:  # type: ignore[no-untyped-def]
    """Chi-square over the first three tokens of 1,200 seeded requests, the second and third
    verified as guesses, against the target's own probabilities (temperature 1, top-k 3: 27
    cells). The seeds are fixed, so the statistic is the same on every run."""
    model, hf = tiny["llama"]
    prompt = repeating_prompts(model.config.vocab_size, 1, seed=4)[0]
    count, k = 1200, 3

    def top(prefix: list[int]) -> tuple[list[int], list[float]]:
        with torch.inference_mode():
            probs = torch.softmax(hf(torch.tensor([prefix])).logits[0, -1], -1)
        best = probs.topk(k)
        return best.indices.tolist(), (best.values / best.values.sum()).tolist()

    expected: dict[tuple[int, ...], float] = {}
    guesses: dict[int, list[int]] = {}
    for t1, p1 in zip(*top(prompt), strict=True):
        second, p2s = top([*prompt, t1])
        guesses[t1] = [second[0], top([*prompt, t1, second[0]])[0][0]]
        for t2, p2 in zip(second, p2s, strict=True):
            for t3, p3 in zip(*top([*prompt, t1, t2]), strict=True):
                expected[t1, t2, t3] = p1 * p2 * p3 * count
    params = [
        SamplingParams(max_new_tokens=4, ignore_eos=True, temperature=1.0, top_k=k, seed=s)
        for s in range(count)
    ]
    config = replace(attention_config("native-paged"), max_num_seqs=64, speculative=NGRAM)
    engine = Engine(model, config)
    assert engine.speculator is not None
    engine.speculator.proposer = Oracle(guesses)
    result = run_all(engine, [EngineRequest(str(s), prompt, p) for s, p in enumerate(params)])
    kept, made = accepted(result)
    assert made >= 2 * count and 0 < kept < made  # every request's 2nd and 3rd were guessed
    observed = dict.fromkeys(expected, 0)
    for ids in tokens(result):
        observed[tuple(ids[:3])] += 1  # KeyError: a token outside the top-k support
    chi2 = sum((observed[c] - e) ** 2 / e for c, e in expected.items() if e >= 5)
    cells = sum(1 for e in expected.values() if e >= 5)
    # The 99.9% quantile of chi-square with 26 degrees of freedom (27 cells): 54.05.
    assert cells >= 20 and chi2 < 54.05, (chi2, observed, expected)


@pytest.fixture(scope="module")
def llama(tiny) -> LoadedModel:  # type: ignore[no-untyped-def]
    return tiny["llama"][0]


def test_stop_strings_and_tokens_inside_an_accepted_run(llama: LoadedModel) -> None:
    prompts = repeating_prompts(llama.config.vocab_size, 6, seed=5)
    config = attention_config("native-paged")
    plain = run(llama, prompts, SamplingParams(max_new_tokens=20, ignore_eos=True), config, None)
    for prompt, done in zip(prompts, plain.completions, strict=True):
        stop_token = done.token_ids[6]
        text = llama.tokenizer.decode(done.token_ids[4:9])
        for params in (
            SamplingParams(max_new_tokens=20, ignore_eos=True, stop_token_ids=(stop_token,)),
            SamplingParams(max_new_tokens=20, ignore_eos=True, stop=(text[-3:],)),
        ):
            want = run(llama, [prompt], params, config, None).completions[0]
            got = run(llama, [prompt], params, config, NGRAM).completions[0]
            assert (got.token_ids, got.text, got.finish_reason) == (
                want.token_ids,
                want.text,
                want.finish_reason,
            )


def test_logprobs_penalties_and_choices_as_without(llama: LoadedModel) -> None:
    prompts = repeating_prompts(llama.config.vocab_size, 4, seed=6)
    config = attention_config("native-paged")
    cases = [
        SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=3),
        SamplingParams(max_new_tokens=16, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(
            max_new_tokens=16, ignore_eos=True, presence_penalty=0.5, frequency_penalty=0.3
        ),
        SamplingParams(max_new_tokens=16, ignore_eos=True, min_tokens=8, logit_bias=((5, 2.0),)),
        SamplingParams(max_new_tokens=12, ignore_eos=True, n=3, temperature=0.8, seed=9),
    ]
    for params in cases:
        want, got = (run(llama, prompts, params, config, s) for s in (None, NGRAM))
        for a, b in zip(want.completions, got.completions, strict=True):
            assert b.token_ids == a.token_ids
            assert [c.token_ids for c in b.choices] == [c.token_ids for c in a.choices]
            if a.logprobs is not None:
                assert b.logprobs is not None
                assert (b.logprobs.tokens, b.logprobs.top_ids) == (
                    a.logprobs.tokens,
                    a.logprobs.top_ids,
                )
                torch.testing.assert_close(
                    b.logprobs.token_logprobs, a.logprobs.token_logprobs, atol=1e-4, rtol=0
                )


def test_constrained_requests_match(tiny_checkpoints: dict[str, Path]) -> None:
    model = load_model(tiny_checkpoints["llama"])
    config = attention_config("native-paged")
    constraint = Constraint("regex", "(ab|abc){2,8}x")
    prompt = model.tokenizer.encode("abcabcabcab")
    params = SamplingParams(max_new_tokens=30, constraint=constraint)
    want, got = (run(model, [prompt] * 3, params, config, s) for s in (None, NGRAM))
    assert tokens(got) == tokens(want)
    assert [c.text for c in got.completions] == [c.text for c in want.completions]


def test_prefix_caching_and_preemption_as_without(llama: LoadedModel) -> None:
    """A pool of 64 four-token blocks for 12 sequences: preemptions and cached prefixes both
    happen, guesses are trimmed back, and the tokens stay the same."""
    base = repeating_prompts(llama.config.vocab_size, 12, seed=7)
    prompts = [base[0][:16] + p for p in base]  # a shared prefix of 4 blocks
    config = replace(
        attention_config("native-paged"), num_kv_blocks=64, block_size=4, max_model_len=128
    )
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    want, got = (run(llama, prompts, params, config, s) for s in (None, NGRAM))
    assert tokens(got) == tokens(want)
    assert sum(s.num_preempted for s in got.steps) > 0
    assert sum(s.cached_prompt_tokens for s in got.steps) > 0
    assert accepted(got)[0] > 0


def test_streamed_tokens_step_stats_and_opt_out(llama: LoadedModel) -> None:
    prompts = repeating_prompts(llama.config.vocab_size, 3, seed=8)
    engine = Engine(llama, replace(attention_config("native-paged"), speculative=NGRAM))
    engine.add(EngineRequest("on", prompts[0], SamplingParams(max_new_tokens=20, ignore_eos=True)))
    off = SamplingParams(max_new_tokens=20, ignore_eos=True, speculate=False)
    engine.add(EngineRequest("off", prompts[1], off))
    streamed: dict[str, list[int]] = {"on": [], "off": []}
    done = {}
    verified = drafted = kept = 0
    while engine.has_work():
        out = engine.step()
        for rid, token in out.new_tokens:
            streamed[rid].append(token)
        done.update({c.request_id: c for c in out.finished})
        verified += out.stats.num_verified_seqs
        drafted += out.stats.num_draft_tokens
        kept += out.stats.num_accepted_draft_tokens
        if out.stats.num_verified_seqs:
            assert out.stats.proposer == "ngram"
    assert streamed["on"] == done["on"].token_ids and streamed["off"] == done["off"].token_ids
    assert done["off"].draft_tokens == 0 and done["on"].draft_tokens == drafted > 0
    assert done["on"].accepted_draft_tokens == kept and verified > 0


def test_cancel_mid_run_frees_everything(llama: LoadedModel) -> None:
    prompts = repeating_prompts(llama.config.vocab_size, 4, seed=9)
    engine = Engine(llama, replace(attention_config("native-paged"), speculative=NGRAM))
    for i, prompt in enumerate(prompts):
        engine.add(
            EngineRequest(str(i), prompt, SamplingParams(max_new_tokens=40, ignore_eos=True))
        )
    for _ in range(6):
        engine.step()
    for i in range(len(prompts)):
        completion = engine.abort(str(i))
        assert completion is not None and completion.finish_reason == "cancelled"
    assert not engine.has_work() and engine.blocks_used == 0
