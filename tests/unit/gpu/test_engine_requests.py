"""Requests the engine must refuse, with the error code each deserves; stop conditions."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import RequestRejected
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from ops.models.offline import run_all

SAMPLING = ErrorCode.INVALID_SAMPLING_PARAMS


@pytest.fixture(scope="module")
def engine(tiny_checkpoints: dict[str, Path]) -> Engine:
    model = load_model(tiny_checkpoints["llama"])
    return Engine(
        model,
        EngineConfig(max_model_len=128, max_prompt_tokens=100, max_new_tokens=64, num_kv_blocks=64),
    )


@pytest.mark.parametrize(
    ("prompt", "params", "code"),
    [
        ([], SamplingParams(), ErrorCode.EMPTY_PROMPT),
        ([1] * 101, SamplingParams(), ErrorCode.PROMPT_TOO_LONG),
        ([1] * 10, SamplingParams(max_new_tokens=65), ErrorCode.MAX_TOKENS_TOO_LARGE),
        ([1] * 100, SamplingParams(max_new_tokens=64), ErrorCode.MAX_TOKENS_TOO_LARGE),  # 164 > 128
        ([1] * 10, SamplingParams(max_new_tokens=0), ErrorCode.INVALID_MAX_TOKENS),
        ([1] * 10, SamplingParams(temperature=-0.1), SAMPLING),
        ([1] * 10, SamplingParams(top_p=0.0), SAMPLING),
        ([1] * 10, SamplingParams(top_p=1.5), SAMPLING),
        ([1] * 10, SamplingParams(top_k=-1), SAMPLING),
        ([1] * 10, SamplingParams(top_k=99999), SAMPLING),
        ([1] * 10, SamplingParams(stop=("",)), SAMPLING),
        ([1] * 10, SamplingParams(stop="\n"), SAMPLING),  # type: ignore[arg-type]
        ([1] * 10, SamplingParams(temperature=float("nan")), SAMPLING),
        ([1] * 10, SamplingParams(seed=-1), SAMPLING),
        ([1] * 10, SamplingParams(stop_token_ids=(99999,)), ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        ([1, 99999], SamplingParams(), ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        ([1, -1], SamplingParams(), ErrorCode.TOKEN_OUT_OF_VOCABULARY),
    ],
)
def test_bad_requests_get_their_error_codes(
    engine: Engine, prompt: list[int], params: SamplingParams, code: ErrorCode
) -> None:
    with pytest.raises(RequestRejected) as info:
        engine.add(EngineRequest("bad", prompt, params))
    assert info.value.code is code
    assert isinstance(info.value, InvalidRequest)  # the ingest's vocabulary too
    assert str(info.value) == info.value.message
    assert not engine.has_work()


def test_duplicate_request_id_is_refused(engine: Engine) -> None:
    engine.add(EngineRequest("dup", [1, 2, 3], SamplingParams(max_new_tokens=2)))
    with pytest.raises(RequestRejected) as info:
        engine.add(EngineRequest("dup", [1, 2, 3], SamplingParams(max_new_tokens=2)))
    assert info.value.code is ErrorCode.DUPLICATE_REQUEST
    assert engine.abort("dup") is not None
    assert not engine.has_work()


def test_abort_returns_partial_completion_and_frees_blocks(engine: Engine) -> None:
    engine.add(EngineRequest("long", [5] * 20, SamplingParams(max_new_tokens=50, ignore_eos=True)))
    for _ in range(3):
        engine.step()
    done = engine.abort("long", reason="deadline")
    assert done is not None and done.finish_reason == "deadline"
    assert len(done.token_ids) == 3
    assert engine.blocks_used == 0
    assert engine.abort("long") is None


def test_length_and_stop_conditions(engine: Engine) -> None:
    model: LoadedModel = engine.model
    prompt = model.tokenizer.encode("The quick brown fox")
    free = run_all(
        engine, [EngineRequest("f", prompt, SamplingParams(max_new_tokens=12, ignore_eos=True))]
    )
    tokens = free.completions[0].token_ids
    assert len(tokens) == 12 and free.completions[0].finish_reason == "length"

    by_token = run_all(
        engine,
        [
            EngineRequest(
                "t",
                prompt,
                SamplingParams(max_new_tokens=12, ignore_eos=True, stop_token_ids=(tokens[3],)),
            )
        ],
    )
    stopped = by_token.completions[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == tokens[: tokens.index(tokens[3]) + 1]
    assert stopped.text == model.tokenizer.decode(stopped.token_ids[:-1])  # stop token not shown

    text = free.completions[0].text
    needle = text[len(text) // 2 : len(text) // 2 + 2]
    by_text = run_all(
        engine,
        [
            EngineRequest(
                "s", prompt, SamplingParams(max_new_tokens=12, ignore_eos=True, stop=(needle,))
            )
        ],
    )
    cut = by_text.completions[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(needle)]
    assert engine.blocks_used == 0


def test_each_step_reports_its_time_in_the_forward_and_outside_it(engine: Engine) -> None:
    """`StepStats.forward_ns`: the forward call's share of a step; `host_ns` the rest (the
    host overhead a CPU forward waits for). A step with nothing to run has no forward."""
    import torch

    engine.add(EngineRequest("timed", [1, 2, 3, 4], SamplingParams(max_new_tokens=3)))
    with torch.inference_mode():
        steps = [engine.step().stats for _ in range(3)]
        idle = engine.step().stats
    for stats in steps:
        assert stats.forward_ns > 0
        assert stats.host_ns == max(0, stats.end_ns - stats.start_ns - stats.forward_ns)
    assert idle.num_seqs == 0 and idle.forward_ns == 0
