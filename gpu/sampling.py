"""Next-token selection: greedy, temperature, top-k, top-p, per-request seeds.

Rows are independent: a row's token depends only on its own logits, its parameters and (when
seeded) its own generator, never on what else shares the batch. (The logits themselves can
differ in the last bits with the batch's shape on some devices and dtypes; on CPU in float32
they do not, which the tests check.) Sampling uses the exponential-race form of the Gumbel
trick (argmax of probs / Exp(1) noise): one noise draw per row, no multinomial call. The
token ids come back to the host once per step, at the end. Structured output's masks
(`mask`) are applied to all constrained rows at once, before any selection.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu.grammar.mask import StepMask
from gpu.sequence import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, position) pairs
_SEED_MASK = (1 << 63) - 1


def seed_for_position(seed: int, position: int) -> int:
    """A generator seed for sampling at `position`: same (seed, position) → same draw."""
    return ((seed & _SEED_MASK) * 1_000_003 + position * _SEED_MIX) & _SEED_MASK


def filter_logits(
    logits: torch.Tensor,  # [rows, vocab] float32
    temperature: torch.Tensor,  # [rows]
    top_k: torch.Tensor,  # [rows] int64, 0 = off
    top_p: torch.Tensor,  # [rows] float32, 1.0 = off
) -> torch.Tensor:  # [rows, vocab] probabilities, zero outside the top-k / top-p set
    logits = logits / temperature.unsqueeze(1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [rows, vocab]
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, logits.shape[-1]).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    cut = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    sorted_probs = sorted_probs.masked_fill(cut, 0.0)
    probs = torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)
    return probs / probs.sum(dim=-1, keepdim=True)


def sample(
    logits: torch.Tensor,  # [rows, vocab] float32
    params: Sequence[SamplingParams],
    positions: Sequence[int],  # position of the token being sampled, per row
    generator: torch.Generator | None = None,  # for unseeded rows
    mask: StepMask | None = None,  # the constrained rows and the tokens each may not take
) -> list[int]:
    if mask is not None and mask.banned.shape[0] == logits.shape[0]:  # every row, in order
        logits = logits.masked_fill(mask.banned, float("-inf"))
    elif mask is not None:
        banned_logits = logits[mask.rows].masked_fill(mask.banned, float("-inf"))
        logits = logits.index_put((mask.rows,), banned_logits)
    greedy = logits.argmax(dim=-1)  # [rows]
    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled_rows:
        return [int(t) for t in greedy.tolist()]
    device = logits.device
    rows = torch.tensor(sampled_rows, device=device)
    chosen = [params[i] for i in sampled_rows]
    probs = filter_logits(
        logits[rows],
        torch.tensor([p.temperature for p in chosen], device=device),
        torch.tensor([p.top_k for p in chosen], device=device),
        torch.tensor([p.top_p for p in chosen], device=device),
    )  # [sampled, vocab]
    noise = torch.empty_like(probs)
    for j, (row, p) in enumerate(zip(sampled_rows, chosen, strict=True)):
        gen = generator
        if p.seed is not None:
            gen = torch.Generator(device=device)
            gen.manual_seed(seed_for_position(p.seed, positions[row]))
        noise[j].exponential_(generator=gen)
    picks = (probs / noise).argmax(dim=-1)  # [sampled]
    tokens = greedy.index_copy(0, rows, picks)
    return [int(t) for t in tokens.tolist()]
