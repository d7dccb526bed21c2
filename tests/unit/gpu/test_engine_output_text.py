"""What a finished request's text shows, through the engine on a tiny random model: EOS
ignored (`ignore_eos`), special tokens kept (`skip_special_tokens` false), and the stop string
or token that ended the output kept (`include_stop_str_in_output`).

A large logit bias towards EOS (the tiny tokenizer's special `<|endoftext|>`) makes the model
emit it at once, so stopping at it, or going past it, is certain."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu.engine import Completion, Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from gpu.sequence import SamplingParams
from ops.models.offline import run_all
from tests.tiny_models import SPECIAL


@pytest.fixture(scope="module")
def engine(tiny_checkpoints: dict[str, Path]) -> Engine:
    model = load_model(tiny_checkpoints["llama"])
    return Engine(
        model,
        EngineConfig(max_model_len=128, max_prompt_tokens=100, max_new_tokens=64, num_kv_blocks=64),
    )


def eos_of(engine: Engine) -> int:
    eos = engine.model.tokenizer.inner.token_to_id(SPECIAL)
    assert eos in engine.model.tokenizer.eos_token_ids
    return int(eos)


def run(engine: Engine, **params: object) -> Completion:
    prompt = engine.model.tokenizer.encode("The quick brown fox")
    done = run_all(engine, [EngineRequest("r", prompt, SamplingParams(**params))])  # type: ignore[arg-type]
    assert engine.blocks_used == 0
    return done.completions[0]


def test_eos_ends_the_output_and_is_not_in_its_text(engine: Engine) -> None:
    eos = eos_of(engine)
    done = run(engine, max_new_tokens=5, logit_bias=((eos, 100.0),))
    assert (done.finish_reason, done.token_ids, done.text) == ("stop", [eos], "")


def test_ignore_eos_generates_past_it(engine: Engine) -> None:
    eos = eos_of(engine)
    done = run(engine, max_new_tokens=5, logit_bias=((eos, 100.0),), ignore_eos=True)
    assert (done.finish_reason, done.token_ids, done.text) == ("length", [eos] * 5, "")


def test_ignore_eos_still_stops_at_a_stop_token(engine: Engine) -> None:
    eos = eos_of(engine)
    params = {"logit_bias": ((eos, 100.0),), "ignore_eos": True, "stop_token_ids": (eos,)}
    done = run(engine, max_new_tokens=5, **params)
    assert (done.finish_reason, done.token_ids) == ("stop", [eos])


def test_special_tokens_are_kept_in_the_text_when_not_skipped(engine: Engine) -> None:
    eos = eos_of(engine)
    params = {"logit_bias": ((eos, 100.0),), "ignore_eos": True}
    kept = run(engine, max_new_tokens=3, skip_special_tokens=False, **params)
    assert kept.text == SPECIAL * 3
    assert run(engine, max_new_tokens=3, **params).text == ""


def test_the_eos_that_ended_the_output_shows_only_when_asked(engine: Engine) -> None:
    eos = eos_of(engine)
    params = {"max_new_tokens": 5, "logit_bias": ((eos, 100.0),), "skip_special_tokens": False}
    assert run(engine, **params).text == ""
    assert run(engine, include_stop_str_in_output=True, **params).text == SPECIAL


def test_a_stop_string_is_kept_when_asked(engine: Engine) -> None:
    free = run(engine, max_new_tokens=12, ignore_eos=True)
    text = free.text
    needle = text[len(text) // 2 : len(text) // 2 + 2]
    base = {"max_new_tokens": 12, "ignore_eos": True, "stop": (needle,)}
    assert run(engine, **base).text == text[: text.index(needle)]
    kept = run(engine, include_stop_str_in_output=True, **base)
    assert kept.finish_reason == "stop"
    assert kept.text == text[: text.index(needle) + len(needle)]


def test_a_stop_token_is_kept_when_asked(engine: Engine) -> None:
    free = run(engine, max_new_tokens=12, ignore_eos=True)
    stop = free.token_ids[3]
    base = {"max_new_tokens": 12, "ignore_eos": True, "stop_token_ids": (stop,)}
    cut = run(engine, **base)
    kept = run(engine, include_stop_str_in_output=True, **base)
    assert kept.token_ids == cut.token_ids and kept.finish_reason == "stop"
    assert kept.text == engine.model.tokenizer.decode(kept.token_ids)
    assert cut.text == engine.model.tokenizer.decode(cut.token_ids[:-1])
