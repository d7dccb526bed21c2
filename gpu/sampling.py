"""Next-token selection: greedy, temperature, top-k, top-p, per-request seeds.

One vectorized path for the whole batch. The host turns each row's `SamplingParams` into
plain numbers (`sampling_rows`); on the device, `sample_tokens` masks, filters and picks
with a fixed sequence of tensor ops: no host reads, no generator objects, no Python loop
over rows, and no shape that depends on tensor values, so a CUDA graph can hold it.

Rows are independent: a row's token depends only on its own logits and parameters and its
(seed, position), never on what else shares the batch. (The logits themselves can differ
in the last bits with the batch's shape on some devices and dtypes; on CPU in float32 they
do not, which the tests check.) Sampled rows use the exponential-race form of the Gumbel
trick, argmax(probs / E), where E is counter-based Exp(1) noise hashed from (seed,
position, token) (`gpu/sampling_noise.py`). Unseeded rows get a fresh random seed per row
per step from the caller's host RNG. Structured output's masks (`mask`) are applied to all
constrained rows at once, before any selection.

The order, vLLM's: the mask; the penalties, logit bias and min_tokens on the raw logits
(`gpu.penalties`); then greedy rows take the argmax, and sampled rows divide by their
temperature, drop tokens under min_p × the top token's probability, apply top-k and top-p,
and draw. A row without min_p (0) keeps every token, bit for bit as without the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gpu.grammar.mask import StepMask
from gpu.penalties import PenaltyRows, PenaltyTensors, apply_penalties
from gpu.sampling_noise import exponential_noise
from gpu.sequence import SamplingParams

_SEED_BITS = 63  # seeds fit a non-negative int64


@dataclass(frozen=True)
class SamplingTensors:
    """One step's per-row sampling parameters, on the device."""

    temperature: torch.Tensor  # [rows] float32, 0 = greedy
    top_k: torch.Tensor  # [rows] int64, 0 = off
    top_p: torch.Tensor  # [rows] float32, 1 = off
    seeds: torch.Tensor  # [rows] int64: the request's seed, else a fresh draw this step
    positions: torch.Tensor  # [rows] int64: position of the token being sampled
    min_p: torch.Tensor  # [rows] float32, 0 = off


@dataclass(frozen=True)
class SamplingRows:
    """`SamplingTensors`' values as host lists, for a backend to write into its own (pinned,
    static) staging buffers; `any_sampled` is False when every row is greedy, `any_filtered`
    when no sampled row has top-k or top-p, `any_min_p` when none has min_p. `penalties`: the
    rows' penalties, biases and min_tokens (`gpu.penalties`), None when no row has any."""

    temperature: list[float]
    top_k: list[int]
    top_p: list[float]
    seeds: list[int]
    positions: list[int]
    min_p: list[float]
    any_sampled: bool
    any_filtered: bool = True
    any_min_p: bool = False
    penalties: PenaltyRows | None = None

    def to_tensors(self, device: torch.device | str) -> SamplingTensors:
        return SamplingTensors(
            temperature=torch.tensor(self.temperature, dtype=torch.float32, device=device),
            top_k=torch.tensor(self.top_k, dtype=torch.int64, device=device),
            top_p=torch.tensor(self.top_p, dtype=torch.float32, device=device),
            seeds=torch.tensor(self.seeds, dtype=torch.int64, device=device),
            positions=torch.tensor(self.positions, dtype=torch.int64, device=device),
            min_p=torch.tensor(self.min_p, dtype=torch.float32, device=device),
        )


def sampling_rows(
    params: Sequence[SamplingParams],
    positions: Sequence[int],  # position of the token being sampled, per row
    draw: Callable[[], int],  # a random seed in [0, 2^63), called once per unseeded sampled row
    penalties: PenaltyRows | None = None,  # `gpu.penalties.penalty_rows` of the same rows
) -> SamplingRows:
    temperature, top_k, top_p, seeds, min_p = [], [], [], [], []
    for p in params:
        temperature.append(0.0 if p.greedy else p.temperature)
        top_k.append(p.top_k)
        top_p.append(p.top_p)
        min_p.append(0.0 if p.greedy else p.min_p)
        if p.greedy:
            seeds.append(0)  # unused
        elif p.seed is None:
            seeds.append(draw() & ((1 << _SEED_BITS) - 1))
        else:
            seeds.append(p.seed & ((1 << _SEED_BITS) - 1))  # negative or huge seeds wrap
    return SamplingRows(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seeds=seeds,
        positions=list(positions),
        min_p=min_p,
        any_sampled=any(not p.greedy for p in params),
        any_filtered=any(not p.greedy and (p.top_k > 0 or p.top_p < 1.0) for p in params),
        any_min_p=any(min_p),
        penalties=penalties,
    )


def filter_logits(
    logits: torch.Tensor,  # [rows, vocab] float32
    temperature: torch.Tensor,  # [rows], > 0
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


def apply_mask(
    logits: torch.Tensor,  # [rows, vocab] float32
    mask: StepMask | None,  # the constrained rows and the tokens each may not take
) -> torch.Tensor:  # [rows, vocab], banned tokens at -inf
    if mask is None:
        return logits
    if mask.banned.shape[0] == logits.shape[0]:  # every row, in order
        return logits.masked_fill(mask.banned, float("-inf"))
    banned_logits = logits[mask.rows].masked_fill(mask.banned, float("-inf"))
    return logits.index_put((mask.rows,), banned_logits)


def sample_tokens(
    logits: torch.Tensor,  # [rows, vocab] float32
    t: SamplingTensors,
    mask: StepMask | None,
    any_sampled: bool,  # False: every row is greedy, so skip the sampling math
    any_filtered: bool = True,  # False: no row has top-k or top-p, so skip the sort
    *,
    penalties: PenaltyTensors | None = None,  # None: no row has penalties, bias or min_tokens
    any_min_p: bool = False,  # False: no sampled row has min_p, so skip that cut
) -> torch.Tensor:  # [rows] int64 token ids, on logits' device
    logits = apply_penalties(apply_mask(logits, mask), penalties)
    greedy = logits.argmax(dim=-1)  # [rows]
    if not any_sampled:
        return greedy
    sampled = t.temperature > 0  # [rows]
    # Greedy rows' temperature is 0; divide them by 1 instead and discard their picks.
    temperature = torch.where(sampled, t.temperature, 1.0)
    # A row without top-k or top-p takes the plain softmax whatever its neighbours ask (its
    # probabilities, and so its draw, never depend on the batch); the others the sort.
    probs = (logits / temperature.unsqueeze(1)).softmax(dim=-1)  # [rows, vocab]
    if any_min_p:
        # min_p 0 cuts nothing (no probability is under 0); the race needs no renormalizing.
        cut = probs < t.min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)  # [rows, vocab]
        logits = logits.masked_fill(cut, float("-inf"))  # what top-k / top-p see
        probs = probs.masked_fill(cut, 0.0)
    if any_filtered:
        filtered = ((t.top_k > 0) | (t.top_p < 1.0)).unsqueeze(1)  # [rows, 1]
        probs = torch.where(filtered, filter_logits(logits, temperature, t.top_k, t.top_p), probs)
    noise = exponential_noise(t.seeds, t.positions, logits.shape[-1])  # [rows, vocab]
    picks = (probs / noise).argmax(dim=-1)  # [rows]
    return torch.where(sampled, picks, greedy)


def sample(
    logits: torch.Tensor,  # [rows, vocab] float32
    params: Sequence[SamplingParams],
    positions: Sequence[int],  # position of the token being sampled, per row
    generator: torch.Generator | None = None,  # seeds the unseeded rows
    mask: StepMask | None = None,  # the constrained rows and the tokens each may not take
    penalties: PenaltyRows | None = None,  # `gpu.penalties.penalty_rows` of the same rows
) -> list[int]:
    """`sample_tokens` for callers holding `SamplingParams`; the token ids come back to the
    host. Unseeded rows' seeds are drawn from `generator` in one call (one read back when it
    lives on a device; a caller that cares keeps a host generator)."""
    unseeded = sum(1 for p in params if not p.greedy and p.seed is None)
    device = generator.device if generator is not None else torch.device("cpu")
    drawn = iter(
        torch.randint(
            0, (1 << _SEED_BITS) - 1, (unseeded,), generator=generator, device=device
        ).tolist()
    )
    rows = sampling_rows(params, positions, lambda: next(drawn), penalties)
    t = rows.to_tensors(logits.device)
    tokens = sample_tokens(
        logits,
        t,
        mask,
        rows.any_sampled,
        rows.any_filtered,
        penalties=None if penalties is None else penalties.to_tensors(logits.device),
        any_min_p=rows.any_min_p,
    )
    return [int(token) for token in tokens.tolist()]
