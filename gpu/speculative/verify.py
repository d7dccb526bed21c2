"""Which guessed tokens a verify chunk keeps: those its own samples agree with.

The verify chunk's forward gives the target model's logits after the sequence's last token
and after each guess; the engine samples every one of those rows exactly as it samples a
plain decode (same filters, penalties, grammar mask and seeded noise at the same position).
A guess is kept while it equals the token sampled at its position; the first disagreement
ends the run, and that row's own sample is the step's last token (after k kept guesses, the
row past them gives one token more):

    guesses   d0 d1 d2 d3          sampled   d0 d1 x  ·       kept 2: d0 d1 x

Greedy rows: the longest agreeing prefix plus the model's next token, so the output is the
one decoding without speculation gives. Sampled rows: the proposers guess one token per
position (a point mass q), and the target's own sample t at that position decides; t = d
happens with probability p(d) = min(1, p(d)/q(d)), the speculative-sampling papers'
acceptance, and when t ≠ d it is drawn from p without d, which is their residual
norm(max(0, p - q)). So every token is distributed exactly as the target's, and since the
noise is the request's (seed, position, token) hash (`gpu.sampling_noise`), a seeded request
samples the very tokens it samples without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence


def accepted_run(draft: Sequence[int], sampled: Sequence[int]) -> int:
    """How many leading guesses of `draft` the samples keep (`sampled[j]`: the token sampled
    at guess j's position; one more row follows the last guess)."""
    if len(sampled) != len(draft) + 1:
        raise ValueError(f"{len(draft)} guesses need {len(draft) + 1} sampled rows")
    for j, guess in enumerate(draft):
        if sampled[j] != guess:
            return j
    return len(draft)
