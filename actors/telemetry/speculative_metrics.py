"""Speculative decoding's metrics, per proposer (`ngram`, `draft`, ...), from each engine step.

A step in which some sequences were verified (`StepStats.proposer` set) adds its guessed
tokens, the accepted ones and the verified sequences to three counters, and observes the
tokens each verified sequence gained (accepted / verified + 1: the model's own next token
comes with every verification). The acceptance rate is derived in PromQL
(docs/operations.md):

    rate(tokenmill_speculative_accepted_tokens_total[5m])
      / rate(tokenmill_speculative_draft_tokens_total[5m])

A step without speculation records nothing, so a worker without `--speculative` exposes no
series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

if TYPE_CHECKING:
    from gpu.engine_io import StepStats  # gpu imports torch; only its fields are read here

# 1 (nothing accepted) up to k + 1 for the k guesses a proposer makes (k is at most 16).
TOKENS_PER_SEQ_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 17.0)


class SpeculativeMetrics:
    """The speculative decoding series of one worker's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.draft_tokens = Counter(
            "tokenmill_speculative_draft_tokens",
            "Tokens proposed for verification, by proposer.",
            ["proposer"],
            registry=registry,
        )
        self.accepted_tokens = Counter(
            "tokenmill_speculative_accepted_tokens",
            "Proposed tokens the model accepted, by proposer.",
            ["proposer"],
            registry=registry,
        )
        self.verified_seqs = Counter(
            "tokenmill_speculative_verified_seqs",
            "Sequences whose proposed tokens were verified, counted once per step, by proposer.",
            ["proposer"],
            registry=registry,
        )
        self.tokens_per_seq = Histogram(
            "tokenmill_speculative_tokens_per_seq",
            "Per step with speculation: tokens a verified sequence gained (accepted / verified "
            "sequences + 1), by proposer.",
            ["proposer"],
            buckets=TOKENS_PER_SEQ_BUCKETS,
            registry=registry,
        )

    def observe_step(self, stats: StepStats) -> None:
        """One engine step: nothing unless a proposer guessed for some sequence."""
        proposer = stats.proposer
        if proposer is None:
            return
        self.draft_tokens.labels(proposer).inc(stats.num_draft_tokens)
        self.accepted_tokens.labels(proposer).inc(stats.num_accepted_draft_tokens)
        self.verified_seqs.labels(proposer).inc(stats.num_verified_seqs)
        tokens_per_seq = self.tokens_per_seq.labels(proposer)  # its series exists from now on
        if stats.num_verified_seqs > 0:
            tokens_per_seq.observe(stats.num_accepted_draft_tokens / stats.num_verified_seqs + 1)
