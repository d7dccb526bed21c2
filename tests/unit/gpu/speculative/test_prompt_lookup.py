"""Prompt lookup: the longest recent n-gram match of the tail, and the tokens after it."""

from gpu.speculative.config import SpeculativeConfig
from gpu.speculative.prompt_lookup import PromptLookup
from gpu.speculative.proposer import ProposalRequest


def ask(lookup: PromptLookup, tokens: list[int], max_tokens: int = 16, seq: str = "a") -> list[int]:
    return lookup.propose([ProposalRequest(seq, tokens, len(tokens), max_tokens)])[0]


def test_the_tokens_after_the_tails_earlier_occurrence() -> None:
    lookup = PromptLookup(SpeculativeConfig("ngram", k=3))
    assert ask(lookup, [1, 2, 3, 4, 5, 6, 9, 2, 3]) == [4, 5, 6]


def test_k_and_the_requests_room_bound_the_guess() -> None:
    lookup = PromptLookup(SpeculativeConfig("ngram", k=2))
    assert ask(lookup, [1, 2, 3, 4, 5, 1, 2]) == [3, 4]
    assert ask(PromptLookup(SpeculativeConfig("ngram", k=8)), [1, 2, 3, 4, 5, 1, 2], 1) == [3]


def test_longest_ngram_first() -> None:
    # "7 8" occurred before 1; "8" alone most recently before 2: the bigram wins.
    lookup = PromptLookup(SpeculativeConfig("ngram", k=1, ngram_min=1, ngram_max=2))
    assert ask(lookup, [7, 8, 1, 0, 8, 2, 0, 7, 8]) == [1]


def test_the_most_recent_occurrence_wins() -> None:
    lookup = PromptLookup(SpeculativeConfig("ngram", k=1, ngram_min=2, ngram_max=2))
    assert ask(lookup, [5, 6, 1, 5, 6, 2, 0, 5, 6]) == [2]


def test_no_match_or_too_short_guesses_nothing() -> None:
    lookup = PromptLookup(SpeculativeConfig("ngram", k=4, ngram_min=2, ngram_max=3))
    assert ask(lookup, [1, 2, 3, 4]) == []
    assert ask(lookup, [1], seq="b") == []
    assert ask(lookup, [], seq="c") == []


def test_the_tail_itself_is_no_match() -> None:
    lookup = PromptLookup(SpeculativeConfig("ngram", k=4, ngram_min=1, ngram_max=1))
    assert ask(lookup, [1, 2, 3]) == []


def test_the_index_grows_with_the_sequence_step_by_step() -> None:
    """Asked again with more tokens, the answer is what a fresh index gives."""
    config = SpeculativeConfig("ngram", k=3, ngram_min=1, ngram_max=3)
    grown = PromptLookup(config)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3]
    for end in range(1, len(tokens) + 1):
        fresh = PromptLookup(config)
        assert ask(grown, tokens[:end]) == ask(fresh, tokens[:end]), end


def test_release_forgets_the_sequence() -> None:
    lookup = PromptLookup(SpeculativeConfig("ngram", k=2))
    ask(lookup, [1, 2, 3, 1, 2])
    lookup.release("a")
    lookup.release("never-seen")  # no error
    assert "a" not in lookup._indexes
