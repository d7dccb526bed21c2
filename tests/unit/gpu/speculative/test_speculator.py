"""The speculator cuts each guess to what its sequence may take, and clears it after the step."""

from collections.abc import Sequence as Seqs

from gpu.sequence import SamplingParams, Sequence
from gpu.speculative.config import SpeculativeConfig
from gpu.speculative.policy import StepAside
from gpu.speculative.proposer import ProposalRequest
from gpu.speculative.speculator import SpeculationLimits, Speculator


class Fixed:
    """Guesses 100, 101, ... up to what each request may take; remembers what it was asked."""

    name = "fixed"

    def __init__(self) -> None:
        self.asked: list[ProposalRequest] = []
        self.released: list[str] = []

    def propose(self, requests: Seqs[ProposalRequest]) -> list[list[int]]:
        self.asked.extend(requests)
        return [list(range(100, 100 + 16)) for _ in requests]

    def release(self, seq_id: str) -> None:
        self.released.append(seq_id)


def decoding(name: str, prompt: int = 5, out: int = 3, **params: object) -> Sequence:
    seq = Sequence(name, list(range(prompt)), SamplingParams(**params), arrival_time=0.0)  # type: ignore[arg-type]
    seq.output_token_ids = list(range(out))
    seq.num_computed_tokens = seq.num_tokens - 1
    return seq


def speculator(k: int = 4, max_model_len: int = 100, original: int | None = None) -> Speculator:
    return Speculator(
        Fixed(),
        SpeculativeConfig("ngram", k=k),
        SpeculationLimits(max_model_len, original),
        StepAside(explore_every=1000),
    )


def test_k_bounds_the_guess() -> None:
    spec = speculator(k=3)
    seq = decoding("a", max_new_tokens=50)
    spec.propose([seq], {})
    assert seq.draft_token_ids == [100, 101, 102]
    spec.clear()
    assert seq.draft_token_ids == []


def test_room_leaves_one_token_for_the_model() -> None:
    spec = speculator(k=8, max_model_len=12)
    near_length = decoding("a", out=3, max_new_tokens=6)  # 3 more tokens: 2 guesses
    near_context = decoding("b", prompt=5, out=3, max_new_tokens=50)  # 8 of 12: 3 guesses
    last = decoding("c", out=5, max_new_tokens=6)  # one token left: no guess
    spec.propose([near_length, near_context, last], {})
    assert len(near_length.draft_token_ids) == 2
    assert len(near_context.draft_token_ids) == 3
    assert last.draft_token_ids == []


def test_longrope_guesses_stop_at_the_original_length() -> None:
    spec = speculator(k=8, original=10)
    seq = decoding("a", prompt=5, out=3, max_new_tokens=50)  # 8 tokens: up to 2 more
    spec.propose([seq], {})
    assert len(seq.draft_token_ids) == 2
    past = decoding("b", prompt=5, out=7, max_new_tokens=50)  # already long: no cap
    spec.propose([past], {})
    assert len(past.draft_token_ids) == 8


def test_opted_out_prefilling_and_prompt_scoring_sequences_guess_nothing() -> None:
    spec = speculator()
    opted_out = decoding("a", max_new_tokens=50, speculate=False)
    prefilling = decoding("b", max_new_tokens=50)
    prefilling.num_computed_tokens = 2
    scoring = decoding("c", out=0, max_new_tokens=50, prompt_logprobs=1)
    spec.propose([opted_out, prefilling, scoring], {})
    assert [s.draft_token_ids for s in (opted_out, prefilling, scoring)] == [[], [], []]
    assert isinstance(spec.proposer, Fixed) and spec.proposer.asked == []


class Grammar:
    """Allows the first `allowed` tokens of any guess."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed

    def valid_prefix(self, tokens: list[int]) -> int:
        return min(self.allowed, len(tokens))


def test_a_constrained_guess_ends_at_its_first_refused_token() -> None:
    spec = speculator(k=4)
    cut, refused = decoding("a", max_new_tokens=50), decoding("b", max_new_tokens=50)
    spec.propose([cut, refused], {"a": Grammar(2), "b": Grammar(0)})  # type: ignore[dict-item]
    assert cut.draft_token_ids == [100, 101]
    assert refused.draft_token_ids == []


def test_a_policy_that_steps_aside_asks_nothing() -> None:
    spec = speculator()
    spec.policy.measured(1, True, tokens=1, seconds=1.0)
    spec.policy.measured(1, False, tokens=1, seconds=0.1)
    seq = decoding("a", max_new_tokens=50)
    spec.propose([seq], {})
    assert seq.draft_token_ids == []


def test_the_request_carries_the_sequences_tokens() -> None:
    spec = speculator(k=2)
    seq = decoding("a", prompt=4, out=2, max_new_tokens=50)
    spec.propose([seq], {})
    assert isinstance(spec.proposer, Fixed)
    (asked,) = spec.proposer.asked
    assert (list(asked.token_ids), asked.num_prompt_tokens, asked.max_tokens) == (
        [0, 1, 2, 3, 0, 1],
        4,
        2,
    )
    spec.release("a")
    assert spec.proposer.released == ["a"]


def test_the_first_speculative_step_after_plain_ones_is_not_measured() -> None:
    """A draft model catches up then on the tokens it missed: not what speculating costs."""
    spec = speculator()
    seq = decoding("a", max_new_tokens=50)
    spec.propose([seq], {})
    spec.measured(decode_only=True, drafted=True, tokens=1, seconds=1.0)  # warming: skipped
    assert spec.policy.goodput(1) == (None, None)
    spec.propose([seq], {})
    spec.measured(decode_only=True, drafted=True, tokens=3, seconds=0.01)
    assert spec.policy.goodput(1) == (300.0, None)
    spec.measured(decode_only=False, drafted=False, tokens=9, seconds=0.01)  # prefill: no
    assert spec.policy.goodput(1) == (300.0, None)
