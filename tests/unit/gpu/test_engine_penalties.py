"""Penalties, logit bias, min_tokens and min_p through the engine, against transformers.

Presence and frequency penalties are checked against a transformers loop that applies
OpenAI's formula by hand; the repetition penalty against transformers' own
`generate(repetition_penalty=...)`. Every check runs on both decode attentions and on the
static decode path (`decode_graphs="eager"`: what CUDA graphs replay), with prompts
prefilled in chunks, and again under preemption.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from ops.models.offline import run_all
from tests.unit.gpu.test_engine import CHUNKY, attention_config, engine_tokens, random_prompts

PATHS = {
    "native-paged": CHUNKY,
    "sdpa-gather": replace(CHUNKY, native_kernels=False),
    "static": replace(CHUNKY, decode_graphs="eager"),
}
NEW = 16


def path_config(path: str) -> EngineConfig:
    if path != "sdpa-gather":
        attention_config("native-paged")  # skips the native paths without a C compiler
    return PATHS[path]


@pytest.fixture(scope="module")
def models(tiny_checkpoints: dict[str, Path]) -> dict[str, tuple[LoadedModel, object]]:
    from transformers import AutoModelForCausalLM

    return {
        arch: (
            load_model(tiny_checkpoints[arch]),
            AutoModelForCausalLM.from_pretrained(
                tiny_checkpoints[arch], dtype=torch.float32
            ).eval(),
        )
        for arch in ("llama", "gpt2")
    }


def hf_penalized_greedy(  # type: ignore[no-untyped-def]
    hf,
    prompt: list[int],
    n: int,
    *,
    presence: float = 0.0,
    frequency: float = 0.0,
    bias: dict[int, float] | None = None,
) -> list[int]:
    """Greedy decoding in transformers with OpenAI's penalties written out: each step's
    logits, plus the bias, minus frequency × (times the token is in the completion) and
    presence × (whether it is)."""
    ids, out = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].float()  # [vocab]
        for token, value in (bias or {}).items():
            logits[token] += value
        counts = torch.zeros_like(logits)
        for token in out:
            counts[token] += 1
        logits = logits - frequency * counts - presence * (counts > 0).float()
        token = int(logits.argmax())
        out.append(token)
        ids.append(token)
    return out


def hf_repetition_greedy(hf, prompt: list[int], n: int, penalty: float) -> list[int]:  # type: ignore[no-untyped-def]
    hf.generation_config.eos_token_id = None  # run past EOS, as `ignore_eos`
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        repetition_penalty=penalty,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]


def run(
    model: LoadedModel, prompts: list[list[int]], params: list[SamplingParams], config: EngineConfig
) -> list[list[int]]:
    engine = Engine(model, config)
    requests = [EngineRequest(str(i), p, params[i]) for i, p in enumerate(prompts)]
    return [c.token_ids for c in run_all(engine, requests).completions]


PENALTIES = [  # (presence, frequency)
    (0.0, 0.0),  # a plain row among penalized ones stays plain greedy
    (1.5, 0.0),
    (0.0, 0.7),
    (-0.5, 2.0),
    (2.0, 2.0),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_presence_and_frequency_penalties_match_a_transformers_loop(
    models, arch: str, path: str
) -> None:  # type: ignore[no-untyped-def]
    model, hf = models[arch]
    config = path_config(path)
    prompts = random_prompts(model.config.vocab_size, len(PENALTIES), seed=31, low=5, high=70)
    params = [
        SamplingParams(max_new_tokens=NEW, ignore_eos=True, presence_penalty=p, frequency_penalty=f)
        for p, f in PENALTIES
    ]
    got = run(model, prompts, params, config)
    plain = engine_tokens(model, prompts, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    for i, (presence, frequency) in enumerate(PENALTIES):
        want = hf_penalized_greedy(hf, prompts[i], NEW, presence=presence, frequency=frequency)
        assert got[i] == want, f"row {i}: presence {presence}, frequency {frequency}"
    assert got[0] == plain[0]
    assert sum(g != p for g, p in zip(got[1:], plain[1:], strict=True)) >= 3  # they do bite


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_repetition_penalty_matches_transformers_generate(models, arch: str, path: str) -> None:  # type: ignore[no-untyped-def]
    model, hf = models[arch]
    config = path_config(path)
    penalties = [1.0, 1.3, 2.0, 0.5]
    prompts = random_prompts(model.config.vocab_size, len(penalties), seed=32, low=5, high=70)
    params = [
        SamplingParams(max_new_tokens=NEW, ignore_eos=True, repetition_penalty=r) for r in penalties
    ]
    got = run(model, prompts, params, config)
    for i, penalty in enumerate(penalties):
        assert got[i] == hf_repetition_greedy(hf, prompts[i], NEW, penalty), f"penalty {penalty}"


@pytest.mark.parametrize("path", PATHS)
def test_logit_bias_matches_a_transformers_loop(models, path: str) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["llama"]
    config = path_config(path)
    vocab = model.config.vocab_size
    prompts = random_prompts(vocab, 3, seed=33, low=5, high=40)
    plain = engine_tokens(model, prompts, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    biases = [
        {plain[0][0]: -100.0},  # the greedy first token, banned
        {7: 100.0},  # forced
        {plain[2][0]: -3.0, plain[2][1]: 2.5, 11: 1.0},
    ]
    params = [
        SamplingParams(
            max_new_tokens=NEW,
            ignore_eos=True,
            logit_bias=tuple(b.items()),
            frequency_penalty=0.5 if i == 2 else 0.0,
        )
        for i, b in enumerate(biases)
    ]
    got = run(model, prompts, params, config)
    assert plain[0][0] not in got[0]
    assert got[1] == [7] * NEW
    for i, bias in enumerate(biases):
        frequency = 0.5 if i == 2 else 0.0
        want = hf_penalized_greedy(hf, prompts[i], NEW, bias=bias, frequency=frequency)
        assert got[i] == want, f"row {i}"


@pytest.mark.parametrize("path", PATHS)
def test_min_tokens_delays_eos_and_stop_tokens(models, path: str) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    config = path_config(path)
    (eos,) = model.eos_token_ids
    prompt = random_prompts(model.config.vocab_size, 1, seed=34, low=10, high=30)[0]
    forced = ((eos, 100.0),)  # EOS every step, unless banned
    engine = Engine(model, config)
    requests = [
        EngineRequest("now", prompt, SamplingParams(max_new_tokens=NEW, logit_bias=forced)),
        EngineRequest(
            "later", prompt, SamplingParams(max_new_tokens=NEW, logit_bias=forced, min_tokens=5)
        ),
        EngineRequest("exact", prompt, SamplingParams(max_new_tokens=5, min_tokens=5)),
    ]
    done = {c.request_id: c for c in run_all(engine, requests).completions}
    assert done["now"].token_ids == [eos] and done["now"].finish_reason == "stop"
    later = done["later"]
    assert len(later.token_ids) == 6 and later.finish_reason == "stop"
    assert eos not in later.token_ids[:5] and later.token_ids[5] == eos
    assert len(done["exact"].token_ids) == 5

    plain = engine_tokens(model, [prompt], SamplingParams(max_new_tokens=NEW, ignore_eos=True))[0]
    stop = plain[0]
    stopped = run(
        model,
        [prompt, prompt],
        [
            SamplingParams(max_new_tokens=NEW, ignore_eos=True, stop_token_ids=(stop,)),
            SamplingParams(
                max_new_tokens=NEW, ignore_eos=True, stop_token_ids=(stop,), min_tokens=4
            ),
        ],
        config,
    )
    assert stopped[0] == [stop]
    assert len(stopped[1]) >= 5 and stop not in stopped[1][:4]


def test_min_tokens_ignores_stop_strings_until_reached(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    prompt = model.tokenizer.encode("The quick brown fox")
    (e,) = model.tokenizer.encode("e")
    always_e = SamplingParams(max_new_tokens=12, ignore_eos=True, logit_bias=((e, 100.0),))
    requests = [
        EngineRequest("now", prompt, replace(always_e, stop=("e",))),
        EngineRequest("later", prompt, replace(always_e, stop=("e",), min_tokens=6)),
    ]
    done = {c.request_id: c for c in run_all(Engine(model, CHUNKY), requests).completions}
    assert (done["now"].token_ids, done["now"].text) == ([e], "")
    # The 6th "e" is the first a stop string may end in: the text is cut before it, not before
    # the first one.
    later = done["later"]
    assert (later.token_ids, later.text, later.finish_reason) == ([e] * 6, "eeeee", "stop")


def test_penalized_rows_recompute_to_the_same_tokens_after_preemption(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    prompts = random_prompts(model.config.vocab_size, 10, seed=35, low=20, high=60)
    params = [
        SamplingParams(
            max_new_tokens=NEW,
            ignore_eos=True,
            presence_penalty=0.4 * (i % 3),
            frequency_penalty=0.3 * (i % 2),
            repetition_penalty=1.0 + 0.2 * (i % 4),
            logit_bias=((i, -5.0),),
            min_tokens=i,
        )
        for i in range(10)
    ]
    roomy = run(model, prompts, params, CHUNKY)
    tight = Engine(
        model,
        EngineConfig(block_size=4, max_num_batched_tokens=48, num_kv_blocks=40, max_model_len=160),
    )
    requests = [EngineRequest(str(i), p, params[i]) for i, p in enumerate(prompts)]
    done = run_all(tight, requests).completions
    assert sum(c.num_preemptions for c in done) > 0
    assert [c.token_ids for c in done] == roomy


def test_each_choice_is_penalized_over_its_own_completion(models) -> None:  # type: ignore[no-untyped-def]
    model, hf = models["llama"]
    prompt = random_prompts(model.config.vocab_size, 1, seed=37, low=10, high=40)[0]
    params = SamplingParams(
        max_new_tokens=NEW, ignore_eos=True, n=3, frequency_penalty=0.8, presence_penalty=0.5
    )
    [done] = run_all(Engine(model, CHUNKY), [EngineRequest("n", prompt, params)]).completions
    want = hf_penalized_greedy(hf, prompt, NEW, presence=0.5, frequency=0.8)
    assert [c.token_ids for c in done.choices] == [want] * 3


def test_a_step_without_penalties_stages_none(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    engine = Engine(model, CHUNKY)
    prompt = random_prompts(model.config.vocab_size, 1, seed=38, low=5, high=20)[0]
    engine.add(EngineRequest("plain", prompt, SamplingParams(max_new_tokens=4, temperature=0.7)))
    engine.step()
    assert engine.backend.builder.penalty_tensors() is None  # nothing staged, nothing run
    penalized = SamplingParams(max_new_tokens=4, presence_penalty=0.1)
    engine.add(EngineRequest("penalized", prompt, penalized))
    engine.step()
    assert engine.backend.builder.penalty_tensors() is not None


def test_min_p_one_samples_the_penalized_argmax(models) -> None:  # type: ignore[no-untyped-def]
    model, _ = models["llama"]
    prompts = random_prompts(model.config.vocab_size, 4, seed=36, low=5, high=40)
    greedy = SamplingParams(max_new_tokens=NEW, ignore_eos=True, frequency_penalty=1.0)
    sampled = replace(greedy, temperature=1.5, min_p=1.0, seed=3)
    assert engine_tokens(model, prompts, sampled) == engine_tokens(model, prompts, greedy)


@pytest.mark.slow
def test_smollm2_repetition_and_frequency_penalties_match_transformers(smollm2_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = load_model(smollm2_path)
    hf = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()
    prompt = model.tokenizer.encode("List the colours of the rainbow, then list them again:")
    n = 24
    by_repetition = SamplingParams(max_new_tokens=n, ignore_eos=True, repetition_penalty=1.3)
    by_frequency = SamplingParams(max_new_tokens=n, ignore_eos=True, frequency_penalty=0.8)
    got = run(model, [prompt, prompt], [by_repetition, by_frequency], CHUNKY)
    assert got[0] == hf_repetition_greedy(hf, prompt, n, 1.3)
    assert got[1] == hf_penalized_greedy(hf, prompt, n, frequency=0.8)
