"""`n` choices through the engine: one completion with every choice, the prompt prefilled once,
seeds reproducible per choice, right under preemption, aborted together."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import RequestRejected
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from messages.error_codes import ErrorCode
from ops.models.offline import run_all

PROMPT = [(7 * i + 3) % 200 + 1 for i in range(40)]  # two full blocks of 16 and 8 tokens


@pytest.fixture(scope="module")
def model(tiny_checkpoints: dict[str, Path]) -> LoadedModel:
    return load_model(tiny_checkpoints["llama"])


def engine(model: LoadedModel, **config: object) -> Engine:
    options = {"max_model_len": 128, "num_kv_blocks": 64, "prefix_caching": True, **config}
    return Engine(model, EngineConfig(**options))  # type: ignore[arg-type]


def sampled(n: int, seed: int | None = 11, **params: object) -> SamplingParams:
    fields: dict[str, object] = {"max_new_tokens": 12, **params}
    return SamplingParams(temperature=1.0, seed=seed, ignore_eos=True, n=n, **fields)  # type: ignore[arg-type]


def test_n_choices_come_back_as_one_completion_with_distinct_samples(model: LoadedModel) -> None:
    run = run_all(engine(model), [EngineRequest("r", PROMPT, sampled(4))])
    [completion] = run.completions
    assert completion.request_id == "r" and len(completion.choices) == 4
    assert {c.request_id for c in completion.choices} == {"r"}
    assert all(len(c.token_ids) == 12 and c.finish_reason == "length" for c in completion.choices)
    assert len({tuple(c.token_ids) for c in completion.choices}) > 1  # sampled apart
    first = completion.choices[0]
    assert (completion.token_ids, completion.text) == (first.token_ids, first.text)
    assert completion.prompt_tokens == len(PROMPT)


def test_a_seed_gives_the_same_choices_every_time_and_choice_0_is_the_single_request(
    model: LoadedModel,
) -> None:
    one = run_all(engine(model), [EngineRequest("a", PROMPT, sampled(3))]).completions[0]
    two = run_all(engine(model), [EngineRequest("a", PROMPT, sampled(3))]).completions[0]
    assert [c.token_ids for c in one.choices] == [c.token_ids for c in two.choices]
    single = run_all(engine(model), [EngineRequest("s", PROMPT, sampled(1))]).completions[0]
    assert single.choices == () and single.token_ids == one.choices[0].token_ids


def test_greedy_choices_are_all_the_greedy_output(model: LoadedModel) -> None:
    greedy = SamplingParams(max_new_tokens=8, ignore_eos=True)
    alone = run_all(engine(model), [EngineRequest("g", PROMPT, greedy)]).completions[0]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True, n=3)
    many = run_all(engine(model), [EngineRequest("g", PROMPT, params)]).completions[0]
    assert [c.token_ids for c in many.choices] == [alone.token_ids] * 3


def test_the_prompt_is_prefilled_once_and_its_full_blocks_shared(model: LoadedModel) -> None:
    run = run_all(engine(model), [EngineRequest("p", PROMPT, sampled(4))])
    prefilled = sum(s.num_prefill_tokens for s in run.steps)
    # The first choice computes the whole prompt; each other takes its two full blocks from
    # the cache and computes the last, partial one (8 tokens): 40 + 3 * 8, not 4 * 40.
    assert prefilled == len(PROMPT) + 3 * 8
    assert sum(s.cached_prompt_tokens for s in run.steps) == 3 * 32
    assert run.completions[0].cached_tokens == 0  # the cache held nothing before it


def test_choices_survive_preemption_unchanged(model: LoadedModel) -> None:
    roomy = run_all(engine(model), [EngineRequest("q", PROMPT, sampled(4, max_new_tokens=40))])
    # 4 choices of 80 tokens need 4 * 5 blocks (less the 2 shared): 10 blocks force preemptions.
    tight = engine(model, num_kv_blocks=10)
    run = run_all(tight, [EngineRequest("q", PROMPT, sampled(4, max_new_tokens=40))])
    assert sum(s.num_preempted for s in run.steps) > 0
    assert [c.token_ids for c in run.completions[0].choices] == [
        c.token_ids for c in roomy.completions[0].choices
    ]


def test_abort_stops_every_choice_and_answers_once(model: LoadedModel) -> None:
    e = engine(model)
    e.add(EngineRequest("x", PROMPT, sampled(3)))
    e.step()
    e.step()
    completion = e.abort("x")
    assert completion is not None and completion.request_id == "x"
    assert len(completion.choices) == 3
    assert all(c.finish_reason == "cancelled" for c in completion.choices)
    assert not e.has_work() and not e.sequences
    assert e.abort("x") is None


def test_an_id_running_with_choices_is_a_duplicate_and_n_is_in_range(model: LoadedModel) -> None:
    e = engine(model)
    e.add(EngineRequest("d", PROMPT, sampled(2)))
    for request in (
        EngineRequest("d", PROMPT, sampled(1)),  # the request's own id
        EngineRequest("d#1", PROMPT, sampled(1)),  # one of its choices' ids
    ):
        with pytest.raises(RequestRejected) as info:
            e.add(request)
        assert info.value.code is ErrorCode.DUPLICATE_REQUEST
    for n in (0, 17):
        with pytest.raises(RequestRejected) as info:
            e.add(EngineRequest(f"n{n}", PROMPT, sampled(n)))
        assert info.value.code is ErrorCode.INVALID_REQUEST
