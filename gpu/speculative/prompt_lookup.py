"""Prompt lookup: guess that the text goes on as it did after the last place its tail occurred.

Rewriting, extraction, summaries and code edits copy long spans of their input. For each
sequence the proposer finds the most recent earlier occurrence of its last n tokens (n from
`ngram_max` down to `ngram_min`, longest first) in its prompt and output so far, and guesses
the k tokens that followed it there.

Each sequence keeps an index from n-gram to where it last ended, extended by the tokens added
since the previous step: a step costs O(new tokens × n sizes), not O(context). Guesses that
were rejected are never indexed (only a sequence's own tokens are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpu.speculative.config import SpeculativeConfig
from gpu.speculative.proposer import ProposalRequest


@dataclass
class _Index:
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram → index after it
    indexed: int = 0  # n-grams ending at or before this index are in `ends`


class PromptLookup:
    name = "ngram"

    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.k
        self.sizes = range(config.ngram_max, config.ngram_min - 1, -1)  # longest first
        self._indexes: dict[str, _Index] = {}

    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        return [self._propose(r) for r in requests]

    def _propose(self, request: ProposalRequest) -> list[int]:
        tokens = request.token_ids
        index = self._indexes.setdefault(request.seq_id, _Index())
        # Index every n-gram that ends before the last token: the tail itself must not match.
        self._extend(index, tokens, len(tokens) - 1)
        limit = min(self.k, request.max_tokens)
        for n in self.sizes:
            if n > len(tokens) or limit <= 0:
                continue
            end = index.ends.get(tuple(tokens[len(tokens) - n :]))
            if end is not None:
                return list(tokens[end : end + limit])
        return []

    def _extend(self, index: _Index, tokens: Sequence[int], upto: int) -> None:
        """Index the n-grams ending at indexes index.indexed + 1 .. upto (exclusive ends)."""
        ends = index.ends
        for end in range(max(index.indexed + 1, 1), upto + 1):
            for n in self.sizes:
                if n <= end:
                    ends[tuple(tokens[end - n : end])] = end  # the most recent wins
        index.indexed = max(index.indexed, upto)

    def release(self, seq_id: str) -> None:
        self._indexes.pop(seq_id, None)
