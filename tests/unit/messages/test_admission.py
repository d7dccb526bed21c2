"""messages.admission: each rule, its code, and a value on each side of its boundary."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from messages.admission import (
    check_choices,
    check_lengths,
    check_logprobs,
    check_max_new_tokens,
    check_sampling,
    check_token_ids,
    check_vocabulary,
    prompt_limit,
)
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import (
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_NEW_TOKENS,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    MIN_REPETITION_PENALTY,
    MIN_TOP_P,
    TOKEN_ID_LIMIT,
)

VOCAB = 100


@dataclass(frozen=True)
class Sampling:
    """The fields `check_sampling` reads, with the wire's defaults."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: Any = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    max_new_tokens: int = 16
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: Any = ()
    min_tokens: int = 0


def broken(check: Callable[[], None]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        check()
    assert info.value.message and str(info.value) == info.value.message
    return info.value


def lengths(num_prompt_tokens: int, max_new_tokens: int) -> None:
    """A model of 128 positions admitting prompts of up to 100 and 64 new tokens."""
    check_lengths(
        num_prompt_tokens,
        max_new_tokens,
        max_prompt_tokens=100,
        max_new_tokens_limit=64,
        max_model_len=128,
    )


# --- sampling --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"temperature": -1e-9}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nextafter(MAX_TEMPERATURE, math.inf)}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": math.nextafter(MIN_TOP_P, 0)}, "top_p"),
        ({"top_p": 1e-40}, "top_p"),  # float32 would flush it to 0: no token kept
        ({"top_p": 1.0 + 1e-9}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": TOKEN_ID_LIMIT}, "top_k"),
        ({"top_k": 10**400}, "top_k"),
        ({"stop": ("",)}, "stop strings"),
        ({"stop": ("ok", "")}, "stop strings"),
        ({"stop": "\n"}, "not the string '\\n'"),
        ({"stop": ("x",) * (MAX_STOP_STRINGS + 1)}, f"at most {MAX_STOP_STRINGS} stop strings"),
        ({"stop": ("x" * (MAX_STOP_CHARS + 1),)}, f"at most {MAX_STOP_CHARS} chars"),
        ({"stop_token_ids": (1,) * (MAX_STOP_TOKEN_IDS + 1)}, "stop_token_ids"),
        ({"seed": -1}, "seed"),
        ({"seed": MAX_SEED}, "seed"),
    ],
)
def test_a_broken_sampling_rule(fields: dict[str, Any], words: str) -> None:
    error = broken(lambda: check_sampling(Sampling(**fields)))
    assert error.code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert words in error.message


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"temperature": 0.0},
        {"temperature": MAX_TEMPERATURE},
        {"temperature": 5e-324},  # greedy on the device, which never divides by it
        {"top_p": MIN_TOP_P},
        {"top_p": 1.0},
        {"top_k": 0},
        {"top_k": TOKEN_ID_LIMIT - 1},  # no vocabulary given: only the wire's bound
        {"stop_token_ids": (0, TOKEN_ID_LIMIT - 1)},
        {"stop": ("x",) * MAX_STOP_STRINGS},
        {"stop": ("x" * MAX_STOP_CHARS,)},
        {"stop": ["a list", "works too"]},
        {"stop_token_ids": (10**9,) * MAX_STOP_TOKEN_IDS},
        {"seed": 0},
        {"seed": MAX_SEED - 1},
    ],
)
def test_sampling_within_the_rules(fields: dict[str, Any]) -> None:
    check_sampling(Sampling(**fields))


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"presence_penalty": math.nextafter(MAX_PENALTY, math.inf)}, "presence_penalty"),
        ({"presence_penalty": -MAX_PENALTY - 1e-9}, "presence_penalty"),
        ({"presence_penalty": math.nan}, "presence_penalty"),
        ({"frequency_penalty": math.inf}, "frequency_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": math.nextafter(MIN_REPETITION_PENALTY, 0)}, "repetition_penalty"),
        ({"repetition_penalty": MAX_REPETITION_PENALTY + 1e-9}, "repetition_penalty"),
        ({"repetition_penalty": math.nan}, "repetition_penalty"),
        ({"min_p": -1e-9}, "min_p"),
        ({"min_p": 1.0 + 1e-9}, "min_p"),
        ({"min_p": math.nan}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17}, "min_tokens"),  # over max_new_tokens (16)
        ({"logit_bias": {1: MAX_LOGIT_BIAS + 1e-6}}, "logit_bias"),
        ({"logit_bias": {1: -101.0}}, "logit_bias"),
        ({"logit_bias": {1: math.nan}}, "logit_bias"),
        ({"logit_bias": ((2, 1.0), (3, 200.0))}, "logit_bias"),  # the engine's pairs
        ({"logit_bias": dict.fromkeys(range(MAX_LOGIT_BIAS_ENTRIES + 1), 1.0)}, "entries"),
    ],
)
def test_a_broken_penalty_rule(fields: dict[str, Any], words: str) -> None:
    error = broken(lambda: check_sampling(Sampling(**fields)))
    assert error.code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert words in error.message


@pytest.mark.parametrize(
    "fields",
    [
        {"presence_penalty": MAX_PENALTY, "frequency_penalty": -MAX_PENALTY},
        {"repetition_penalty": MIN_REPETITION_PENALTY},
        {"repetition_penalty": MAX_REPETITION_PENALTY},
        {"min_p": 0.0},
        {"min_p": 1.0},
        {"min_tokens": 16},
        {"logit_bias": {0: -MAX_LOGIT_BIAS, VOCAB - 1: MAX_LOGIT_BIAS}},
        {"logit_bias": dict.fromkeys(range(MAX_LOGIT_BIAS_ENTRIES), 0.0)},
    ],
)
def test_penalties_within_the_rules(fields: dict[str, Any]) -> None:
    check_sampling(Sampling(**fields))
    check_sampling(Sampling(**fields), vocab_size=MAX_LOGIT_BIAS_ENTRIES)


@pytest.mark.parametrize("bias", [{-1: 1.0}, {TOKEN_ID_LIMIT: 1.0}, ((VOCAB, 1.0),)])
def test_logit_bias_ids_are_checked_against_the_vocabulary(bias: Any) -> None:
    error = broken(lambda: check_sampling(Sampling(logit_bias=bias), vocab_size=VOCAB))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert "logit_bias" in error.message
    if bias != ((VOCAB, 1.0),):  # within 2**31: only the model's vocabulary refuses it
        error = broken(lambda: check_sampling(Sampling(logit_bias=bias)))
        assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY


def test_the_first_broken_sampling_rule_is_reported() -> None:
    params = Sampling(temperature=-1.0, top_p=0.0, top_k=-1, stop=("",), seed=-1)
    assert "temperature" in broken(lambda: check_sampling(params)).message
    params = replace(params, temperature=0.0)
    assert "top_p" in broken(lambda: check_sampling(params)).message
    params = replace(params, top_p=1.0)
    assert "top_k" in broken(lambda: check_sampling(params)).message
    params = replace(params, top_k=0)
    assert "stop strings" in broken(lambda: check_sampling(params)).message
    params = replace(params, stop=())
    assert "seed" in broken(lambda: check_sampling(params)).message


def test_top_k_is_bounded_by_a_known_vocabulary() -> None:
    check_sampling(Sampling(top_k=VOCAB), vocab_size=VOCAB)
    error = broken(lambda: check_sampling(Sampling(top_k=VOCAB + 1), vocab_size=VOCAB))
    assert error.code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert error.message == (
        f"top_k must be at most the vocabulary size {VOCAB} (0 = off), got {VOCAB + 1}"
    )


@pytest.mark.parametrize("bad", [-1, VOCAB])
def test_stop_token_ids_are_in_a_known_vocabulary(bad: int) -> None:
    check_sampling(Sampling(stop_token_ids=(0, VOCAB - 1)), vocab_size=VOCAB)
    error = broken(lambda: check_sampling(Sampling(stop_token_ids=(0, bad)), vocab_size=VOCAB))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert error.message.startswith(f"stop_token_ids: token id {bad} ")


@pytest.mark.parametrize("bad", [-1, TOKEN_ID_LIMIT, 10**400])
def test_without_a_vocabulary_stop_token_ids_are_below_2_31(bad: int) -> None:
    error = broken(lambda: check_sampling(Sampling(stop_token_ids=(0, bad))))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert error.message.startswith("stop_token_ids: token id ")
    assert "outside [0, 2**31)" in error.message


# --- vocabulary ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, VOCAB, VOCAB + 1000])
def test_a_token_outside_the_vocabulary(bad: int) -> None:
    error = broken(lambda: check_vocabulary([3, bad, VOCAB + 5], VOCAB, "prompt_token_ids"))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert error.message == (
        f"prompt_token_ids: token id {bad} is outside the vocabulary [0, {VOCAB})"
    )  # the first one outside


def test_tokens_inside_the_vocabulary() -> None:
    check_vocabulary([0, VOCAB - 1], VOCAB, "prompt_token_ids")
    check_vocabulary([], VOCAB, "prompt_token_ids")


@pytest.mark.parametrize("bad", [-1, TOKEN_ID_LIMIT, -(10**400)])
def test_a_token_id_outside_any_vocabulary(bad: int) -> None:
    error = broken(lambda: check_token_ids([3, bad, -5], "prompt_token_ids"))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert error.message.startswith("prompt_token_ids: token id ")
    assert "outside [0, 2**31), the range of any vocabulary" in error.message
    check_token_ids([0, TOKEN_ID_LIMIT - 1], "prompt_token_ids")
    check_token_ids([], "prompt_token_ids")


# --- lengths ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_new_tokens", [0, -1])
def test_max_new_tokens_must_be_positive(max_new_tokens: int) -> None:
    error = broken(lambda: check_max_new_tokens(max_new_tokens))
    assert error.code is ErrorCode.INVALID_MAX_TOKENS
    assert error.message == f"max_new_tokens must be positive, got {max_new_tokens}"
    check_max_new_tokens(1)
    assert broken(lambda: lengths(10, max_new_tokens)).code is ErrorCode.INVALID_MAX_TOKENS


def test_max_new_tokens_may_be_0_to_score_a_prompt() -> None:
    check_max_new_tokens(0, scoring=True)
    error = broken(lambda: check_max_new_tokens(-1, scoring=True))
    assert error.code is ErrorCode.INVALID_MAX_TOKENS
    assert "at least 0" in error.message


@pytest.mark.parametrize("k", [-1, 21])
def test_prompt_logprobs_range_is_logprobs(k: int) -> None:
    error = broken(lambda: check_logprobs(k, "prompt_logprobs"))
    assert error.code is ErrorCode.INVALID_SAMPLING_PARAMS
    assert error.message.startswith("prompt_logprobs must be in [0, 20]")
    check_logprobs(20, "prompt_logprobs")
    check_logprobs(None, "prompt_logprobs")


@pytest.mark.parametrize("max_new_tokens", [MAX_NEW_TOKENS + 1, 10**400])
def test_max_new_tokens_has_a_bound_before_any_model(max_new_tokens: int) -> None:
    error = broken(lambda: check_max_new_tokens(max_new_tokens))
    assert error.code is ErrorCode.MAX_TOKENS_TOO_LARGE
    assert f"over the limit of any model, {MAX_NEW_TOKENS}" in error.message
    check_max_new_tokens(MAX_NEW_TOKENS)


@pytest.mark.parametrize(
    ("num_prompt_tokens", "max_new_tokens", "code", "words"),
    [
        (0, 4, ErrorCode.EMPTY_PROMPT, "the prompt has no tokens"),
        (101, 4, ErrorCode.PROMPT_TOO_LONG, "prompt has 101 tokens; the limit is 100"),
        (10, 65, ErrorCode.MAX_TOKENS_TOO_LARGE, "max_new_tokens 65 is over the limit of 64"),
        (65, 64, ErrorCode.MAX_TOKENS_TOO_LARGE, "max_model_len 128; at most 63 new tokens fit"),
        (100, 29, ErrorCode.MAX_TOKENS_TOO_LARGE, "prompt (100) + max_new_tokens (29) exceeds"),
    ],
)
def test_a_broken_length_rule(
    num_prompt_tokens: int, max_new_tokens: int, code: ErrorCode, words: str
) -> None:
    error = broken(lambda: lengths(num_prompt_tokens, max_new_tokens))
    assert error.code is code
    assert words in error.message


@pytest.mark.parametrize(
    ("num_prompt_tokens", "max_new_tokens"),
    [(1, 1), (100, 28), (10, 64), (64, 64)],
)
def test_lengths_within_the_limits(num_prompt_tokens: int, max_new_tokens: int) -> None:
    lengths(num_prompt_tokens, max_new_tokens)


def test_the_first_broken_length_rule_is_reported() -> None:
    """Empty before too long before max_new_tokens ≤ 0 before over the cap before no room."""
    assert broken(lambda: lengths(0, 0)).code is ErrorCode.EMPTY_PROMPT
    assert broken(lambda: lengths(101, 0)).code is ErrorCode.PROMPT_TOO_LONG
    assert broken(lambda: lengths(100, 0)).code is ErrorCode.INVALID_MAX_TOKENS
    assert "over the limit of 64" in broken(lambda: lengths(100, 65)).message


@pytest.mark.parametrize(
    ("configured", "max_model_len", "limit"),
    [(None, 128, 127), (100, 128, 100), (127, 128, 127), (128, 128, 127), (500, 128, 127)],
)
def test_the_prompt_limit_leaves_room_for_one_new_token(
    configured: int | None, max_model_len: int, limit: int
) -> None:
    assert prompt_limit(configured, max_model_len) == limit


@pytest.mark.parametrize("n", [1, 2, 16])
def test_n_choices_within_range_pass(n: int) -> None:
    check_choices(n)


@pytest.mark.parametrize("n", [0, 17, -3])
def test_n_out_of_range_is_an_invalid_request(n: int) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_choices(n)
    assert info.value.code is ErrorCode.INVALID_REQUEST
