"""The admission rules of a request, written once: sampling, lengths, vocabulary.

Three places admit a request and all of them call these functions, so a rule, its error code
and its message exist once:

- `messages.validation.check_request`, when a record is decoded (no model needed),
- `actors.ingest.model_front.ModelFront.prompt_tokens`, once the model that will run it is
  known (its vocabulary and limits, the prompt's length after tokenizing),
- `gpu.admission.check_admission`, the engine's own door, for callers that come straight to it
  (`tokenmill generate`, benchmarks), which turns the `InvalidRequest` into `RequestRejected`.

Each function raises `messages.errors.InvalidRequest` with the code of the first rule broken
and returns None otherwise. Standard library only: `gpu/` imports this module and runs on
machines that have torch but not msgspec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import (
    MAX_CHOICES,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_LOGPROBS,
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
    number_text,
)


class SamplingFields(Protocol):
    """The sampling fields shared by a wire `GenerateRequest` and the engine's
    `SamplingParams`: what `check_sampling` reads."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def stop(self) -> Sequence[str]: ...
    @property
    def stop_token_ids(self) -> Sequence[int]: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def logit_bias(self) -> Mapping[int, float] | Sequence[tuple[int, float]]: ...
    @property
    def min_tokens(self) -> int: ...


def prompt_limit(max_prompt_tokens: int | None, max_model_len: int) -> int:
    """The most prompt tokens a model admits: its configured cap (None: no cap), and always at
    least one position short of `max_model_len`, so that one new token fits."""
    return min(max_prompt_tokens or max_model_len, max_model_len - 1)


def check_max_new_tokens(max_new_tokens: int, *, scoring: bool = False) -> None:
    """`max_new_tokens` is positive (`INVALID_MAX_TOKENS`) and at most `MAX_NEW_TOKENS`
    (`MAX_TOKENS_TOO_LARGE`), a bound of the wire: a model's own cap is checked with its
    lengths (`check_lengths`). `scoring` (the request asks for prompt logprobs): 0 is allowed
    too, a request that only scores its prompt."""
    if scoring and max_new_tokens < 0:
        raise InvalidRequest(
            ErrorCode.INVALID_MAX_TOKENS,
            "max_new_tokens must be at least 0 (0 with prompt_logprobs: score the prompt only), "
            f"got {number_text(max_new_tokens)}",
        )
    if max_new_tokens <= 0 and not scoring:
        raise InvalidRequest(
            ErrorCode.INVALID_MAX_TOKENS,
            f"max_new_tokens must be positive, got {number_text(max_new_tokens)}",
        )
    if max_new_tokens > MAX_NEW_TOKENS:
        raise InvalidRequest(
            ErrorCode.MAX_TOKENS_TOO_LARGE,
            f"max_new_tokens {number_text(max_new_tokens)} is over the limit of any model, "
            f"{MAX_NEW_TOKENS}",
        )


def check_sampling(params: SamplingFields, *, vocab_size: int | None = None) -> None:
    """The sampling rules (`INVALID_SAMPLING_PARAMS`), with the bounds of `messages.limits`:

    - temperature in [0, `MAX_TEMPERATURE`] (NaN refused). 0 is greedy, and the engine samples
      any temperature under `gpu.sequence.GREEDY_BELOW` (1e-5) greedily too, the limit of
      sampling as the temperature falls: so a tiny positive one (down to 5e-324) is accepted
      and never divides a logit. The maximum is far past where every distribution is
      uniform, and far below float32's largest value, where logits / temperature gives NaN.
    - top_p in [`MIN_TOP_P`, 1]. A positive top_p under float32's smallest normal (1.2e-38)
      reaches the device as 0, which keeps no token; values under the minimum are refused, not
      clamped (a top_p under the top token's probability keeps just that token anyway).
    - top_k in [0, `TOKEN_ID_LIMIT`) (0 = off).
    - stop strings non-empty and within `messages.limits`, at most `MAX_STOP_TOKEN_IDS` stop
      token ids, seed in [0, `MAX_SEED`).

    Stop token ids are in [0, `TOKEN_ID_LIMIT`) (`TOKEN_OUT_OF_VOCABULARY`). With `vocab_size`
    (the model is known), they are inside that vocabulary instead, and top_k ≤ `vocab_size`.
    """

    def bad(message: str) -> InvalidRequest:
        return InvalidRequest(ErrorCode.INVALID_SAMPLING_PARAMS, message)

    p = params
    if not 0 <= p.temperature <= MAX_TEMPERATURE:  # also refuses NaN
        raise bad(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {p.temperature}")
    if not MIN_TOP_P <= p.top_p <= 1:
        raise bad(
            f"top_p must be in [{MIN_TOP_P:g}, 1] (tiny values keep one token), got {p.top_p}"
        )
    if not 0 <= p.top_k < TOKEN_ID_LIMIT:
        raise bad(f"top_k must be in [0, 2**31) (0 = off), got {number_text(p.top_k)}")
    if isinstance(p.stop, str):  # a string is a sequence of strings too: one a character
        raise bad(f"stop must be a sequence of strings, not the string {p.stop!r}")
    if not all(isinstance(s, str) and s for s in p.stop):
        raise bad("stop strings must be non-empty strings")
    if len(p.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in p.stop):
        raise bad(f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} chars")
    if len(p.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise bad(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids")
    if p.seed is not None and not 0 <= p.seed < MAX_SEED:
        raise bad(f"seed must be in [0, 2**63), got {number_text(p.seed)}")
    check_penalties(p, vocab_size=vocab_size)
    if vocab_size is None:
        check_token_ids(p.stop_token_ids, "stop_token_ids")
        return
    if p.top_k > vocab_size:
        raise bad(
            f"top_k must be at most the vocabulary size {vocab_size} (0 = off), got {p.top_k}"
        )
    check_vocabulary(p.stop_token_ids, vocab_size, "stop_token_ids")


def check_logprobs(logprobs: int | None, name: str = "logprobs") -> None:
    """`logprobs` is None (off) or in [0, `MAX_LOGPROBS`]: how many alternatives to report
    beside each generated token's own logprob (`INVALID_SAMPLING_PARAMS`). The same rule for
    `prompt_logprobs` (`name`), beside each prompt token's (`MAX_PROMPT_LOGPROBS`)."""
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise InvalidRequest(
            ErrorCode.INVALID_SAMPLING_PARAMS,
            f"{name} must be in [0, {MAX_LOGPROBS}] (or null: off), got {number_text(logprobs)}",
        )


def check_penalties(params: SamplingFields, *, vocab_size: int | None = None) -> None:
    """The penalty and bias rules (`INVALID_SAMPLING_PARAMS`; NaN refused everywhere), part of
    `check_sampling`, with the bounds of `messages.limits`:

    - presence_penalty and frequency_penalty in [-`MAX_PENALTY`, `MAX_PENALTY`],
    - repetition_penalty in [`MIN_REPETITION_PENALTY`, `MAX_REPETITION_PENALTY`] (1 = off),
    - min_p in [0, 1],
    - min_tokens in [0, max_new_tokens],
    - logit_bias: at most `MAX_LOGIT_BIAS_ENTRIES` entries, each bias in [-`MAX_LOGIT_BIAS`,
      `MAX_LOGIT_BIAS`]; its token ids checked as stop token ids are (`TOKEN_OUT_OF_VOCABULARY`).
    """

    def bad(message: str) -> InvalidRequest:
        return InvalidRequest(ErrorCode.INVALID_SAMPLING_PARAMS, message)

    p = params
    for name, value in (
        ("presence_penalty", p.presence_penalty),
        ("frequency_penalty", p.frequency_penalty),
    ):
        if not -MAX_PENALTY <= value <= MAX_PENALTY:
            raise bad(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value}")
    if not MIN_REPETITION_PENALTY <= p.repetition_penalty <= MAX_REPETITION_PENALTY:
        raise bad(
            f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, "
            f"{MAX_REPETITION_PENALTY:g}] (1 = off), got {p.repetition_penalty}"
        )
    if not 0 <= p.min_p <= 1:
        raise bad(f"min_p must be in [0, 1] (0 = off), got {p.min_p}")
    if not 0 <= p.min_tokens <= p.max_new_tokens:
        raise bad(
            f"min_tokens must be in [0, max_new_tokens = {number_text(p.max_new_tokens)}], "
            f"got {number_text(p.min_tokens)}"
        )
    bias = p.logit_bias
    pairs = list(bias.items()) if isinstance(bias, Mapping) else list(bias)
    if len(pairs) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad(f"logit_bias has {len(pairs)} entries; at most {MAX_LOGIT_BIAS_ENTRIES}")
    wrong = next((v for _, v in pairs if not -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS), None)
    if wrong is not None:
        raise bad(
            f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {wrong}"
        )
    ids = [token for token, _ in pairs]
    if vocab_size is None:
        check_token_ids(ids, "logit_bias")
    else:
        check_vocabulary(ids, vocab_size, "logit_bias")


def check_vocabulary(ids: Sequence[int], vocab_size: int, field: str) -> None:
    """Every token id in `ids` is in [0, `vocab_size`) (`TOKEN_OUT_OF_VOCABULARY`); `field`
    names the ids in the message."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            ErrorCode.TOKEN_OUT_OF_VOCABULARY,
            f"{field}: token id {number_text(bad)} is outside the vocabulary [0, {vocab_size})",
        )


def check_token_ids(ids: Sequence[int], field: str) -> None:
    """Every token id in `ids` is in [0, `TOKEN_ID_LIMIT`), the range of every vocabulary
    (`TOKEN_OUT_OF_VOCABULARY`): the check that needs no model; `field` names the ids."""
    if ids and not (min(ids) >= 0 and max(ids) < TOKEN_ID_LIMIT):  # min, max: C loops
        bad = next(t for t in ids if not 0 <= t < TOKEN_ID_LIMIT)
        raise InvalidRequest(
            ErrorCode.TOKEN_OUT_OF_VOCABULARY,
            f"{field}: token id {number_text(bad)} is outside [0, 2**31), the range of any "
            "vocabulary",
        )


def check_lengths(
    num_prompt_tokens: int,
    max_new_tokens: int,
    *,
    max_prompt_tokens: int,
    max_new_tokens_limit: int,
    max_model_len: int,
    scoring: bool = False,
) -> None:
    """The length rules of a tokenized prompt on a model, in this order: not empty
    (`EMPTY_PROMPT`), at most `max_prompt_tokens` (`PROMPT_TOO_LONG`), `max_new_tokens`
    positive (`INVALID_MAX_TOKENS`; 0 too when `scoring`: prompt logprobs asked) and at most
    `max_new_tokens_limit`, and prompt plus new tokens within `max_model_len` (both
    `MAX_TOKENS_TOO_LARGE`)."""
    if num_prompt_tokens == 0:
        raise InvalidRequest(ErrorCode.EMPTY_PROMPT, "the prompt has no tokens")
    if num_prompt_tokens > max_prompt_tokens:
        raise InvalidRequest(
            ErrorCode.PROMPT_TOO_LONG,
            f"prompt has {num_prompt_tokens} tokens; the limit is {max_prompt_tokens}",
        )
    check_max_new_tokens(max_new_tokens, scoring=scoring)
    if max_new_tokens > max_new_tokens_limit:
        raise InvalidRequest(
            ErrorCode.MAX_TOKENS_TOO_LARGE,
            f"max_new_tokens {max_new_tokens} is over the limit of {max_new_tokens_limit}",
        )
    room = max_model_len - num_prompt_tokens
    if max_new_tokens > room:
        raise InvalidRequest(
            ErrorCode.MAX_TOKENS_TOO_LARGE,
            f"prompt ({num_prompt_tokens}) + max_new_tokens ({max_new_tokens}) exceeds "
            f"max_model_len {max_model_len}; at most {room} new tokens fit",
        )


def check_choices(n: int) -> None:
    """`n` (the choices of one request) in [1, `MAX_CHOICES`]: `INVALID_REQUEST` otherwise. A
    streamed request streams each choice (`GenerateChunk.index`)."""
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST, f"n must be in [1, {MAX_CHOICES}], got {number_text(n)}"
        )
