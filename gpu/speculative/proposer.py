"""What every proposer offers the engine: guesses for a step's running sequences.

A proposer sees plain token lists, never the engine's objects, and may keep state per
sequence (a draft model's own KV) until `release`. Its guesses need not be right: the target
model checks every one (`gpu.speculative.verify`), so a wrong guess costs time, never output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ProposalRequest:
    """One sequence to guess for: its tokens so far (prompt, then output) and how many
    tokens it may take at most (≥ 1)."""

    seq_id: str
    token_ids: Sequence[int]
    num_prompt_tokens: int
    max_tokens: int


class Proposer(Protocol):
    name: str  # "ngram" or "draft": the metrics' label

    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        """For each request, up to `max_tokens` guessed next tokens (possibly none)."""
        ...

    def release(self, seq_id: str) -> None:
        """Forget a sequence (finished, aborted): drop whatever it holds."""
        ...
