"""Requests the engine must refuse, with the typed error each deserves; stop conditions."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import (
    DuplicateRequest,
    EmptyPrompt,
    InvalidSamplingParams,
    MaxTokensTooLarge,
    PromptTooLong,
    RequestRejected,
    TokenOutOfVocabulary,
)
from gpu.loading.loader import LoadedModel, load_model
from gpu.offline import run_all
from gpu.sequence import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_checkpoints: dict[str, Path]) -> Engine:
    model = load_model(tiny_checkpoints["llama"])
    return Engine(
        model,
        EngineConfig(max_model_len=128, max_prompt_tokens=100, max_new_tokens=64, num_kv_blocks=64),
    )


@pytest.mark.parametrize(
    ("prompt", "params", "error"),
    [
        ([], SamplingParams(), EmptyPrompt),
        ([1] * 101, SamplingParams(), PromptTooLong),
        ([1] * 10, SamplingParams(max_new_tokens=65), MaxTokensTooLarge),
        ([1] * 100, SamplingParams(max_new_tokens=64), MaxTokensTooLarge),  # 164 > 128
        ([1] * 10, SamplingParams(max_new_tokens=0), InvalidSamplingParams),
        ([1] * 10, SamplingParams(temperature=-0.1), InvalidSamplingParams),
        ([1] * 10, SamplingParams(top_p=0.0), InvalidSamplingParams),
        ([1] * 10, SamplingParams(top_p=1.5), InvalidSamplingParams),
        ([1] * 10, SamplingParams(top_k=-1), InvalidSamplingParams),
        ([1] * 10, SamplingParams(stop=("",)), InvalidSamplingParams),
        ([1] * 10, SamplingParams(stop="\n"), InvalidSamplingParams),  # type: ignore[arg-type]
        ([1] * 10, SamplingParams(temperature=float("nan")), InvalidSamplingParams),
        ([1, 99999], SamplingParams(), TokenOutOfVocabulary),
        ([1, -1], SamplingParams(), TokenOutOfVocabulary),
    ],
)
def test_bad_requests_get_typed_errors(
    engine: Engine, prompt: list[int], params: SamplingParams, error: type[RequestRejected]
) -> None:
    with pytest.raises(error) as info:
        engine.add(EngineRequest("bad", prompt, params))
    assert info.value.code != "invalid_request"
    assert str(info.value)
    assert not engine.has_work()


def test_duplicate_request_id_is_refused(engine: Engine) -> None:
    engine.add(EngineRequest("dup", [1, 2, 3], SamplingParams(max_new_tokens=2)))
    with pytest.raises(DuplicateRequest):
        engine.add(EngineRequest("dup", [1, 2, 3], SamplingParams(max_new_tokens=2)))
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
