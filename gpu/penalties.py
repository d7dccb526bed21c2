"""Penalties, logit bias and min_tokens: what a request does to its raw logits.

Applied on the device to the float32 logits of a step's sampled rows, before any temperature,
in vLLM's order (after a structured-output mask, which they cannot undo: -inf stays -inf):

1. `min_tokens`: until that many tokens are out, EOS (unless `ignore_eos`) and the
   `stop_token_ids` are set to -inf.
2. `logit_bias`: each (token, bias) added.
3. `repetition_penalty` r (transformers' and vLLM's), over the prompt's and the completion's
   tokens: a seen token's logit is divided by r when positive, multiplied by r otherwise.
4. `frequency_penalty` f and `presence_penalty` p (OpenAI's), over the completion's tokens:
   logit -= f × count + p × (count > 0).

Then `gpu.sampling`: the greedy argmax, or temperature → min_p → top-k / top-p → the draw.

Counts are rebuilt every step from the host's token lists (`penalty_rows`): the completion's
tokens of each penalized row, and the prompt's of each row with a repetition penalty, as
(row, token) pairs in the step's one host→device copy, scattered into [rows, vocab] there. No
state lives on the device between steps, so nothing can go stale: a preempted and recomputed
sequence, a chunked prefill, a sequence re-prefilled past LongRoPE's original length all count
exactly the tokens before the position sampled. The price is host work and copied words linear
in those tokens each step, paid only by rows that ask (the prompt only under
`repetition_penalty`); an incremental [sequences, vocab] count kept on the device would cost a
slot per sequence and its own bookkeeping under preemption, for a saving that matters only
for long prompts under a repetition penalty.

A step none of whose rows asks for any of these stages nothing and runs none of this
(`penalty_rows` returns None); in a step where some do, the others' parameters are neutral
(0, 0, 1, no pairs) and leave their logits bit for bit as they were.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from gpu.sequence import Sequence as Seq


@dataclass(frozen=True)
class PenaltyRows:
    """One step's penalties as host lists (per row, or (row, token) pairs), for a backend to
    stage with the step's inputs. `penalized`: some row has a presence, frequency or
    repetition penalty (so the counts are built)."""

    presence: list[float]
    frequency: list[float]
    repetition: list[float]
    counted: tuple[list[int], list[int]]  # (rows, tokens): completion tokens, penalized rows
    prompt: tuple[list[int], list[int]]  # (rows, tokens): prompt tokens, repetition rows
    bias: tuple[list[int], list[int]]  # (rows, tokens) with a logit bias
    bias_values: list[float]
    banned: tuple[list[int], list[int]]  # (rows, tokens) at -inf for min_tokens
    penalized: bool

    def lists(self) -> list[tuple[list[int] | list[float], bool]]:
        """Each list in `PenaltyTensors`' field order, and whether it holds floats."""
        floats = [self.presence, self.frequency, self.repetition]
        ints = [*self.counted, *self.prompt, *self.bias]
        return [
            *((values, True) for values in floats),
            *((values, False) for values in ints),
            (self.bias_values, True),
            *((values, False) for values in self.banned),
        ]

    def to_tensors(self, device: torch.device | str) -> PenaltyTensors:
        """For callers outside a step (a backend stages these with the step's inputs)."""
        tensors = [
            torch.tensor(v, dtype=torch.float32 if floats else torch.int64, device=device)
            for v, floats in self.lists()
        ]
        return PenaltyTensors.of(tensors, self.penalized)


@dataclass(frozen=True)
class PenaltyTensors:
    """`PenaltyRows` on the device: [rows] float32 per-row values, [pairs] int64 indices."""

    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor
    counted_rows: torch.Tensor
    counted_tokens: torch.Tensor
    prompt_rows: torch.Tensor
    prompt_tokens: torch.Tensor
    bias_rows: torch.Tensor
    bias_tokens: torch.Tensor
    bias_values: torch.Tensor  # float32
    banned_rows: torch.Tensor
    banned_tokens: torch.Tensor
    penalized: bool  # a host flag: build the counts

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor], penalized: bool) -> PenaltyTensors:
        """From tensors in field order (`PenaltyRows.lists`)."""
        presence, frequency, repetition, *pairs = tensors
        counted_rows, counted_tokens, prompt_rows, prompt_tokens = pairs[:4]
        bias_rows, bias_tokens, bias_values, banned_rows, banned_tokens = pairs[4:]
        return cls(
            presence=presence,
            frequency=frequency,
            repetition=repetition,
            counted_rows=counted_rows,
            counted_tokens=counted_tokens,
            prompt_rows=prompt_rows,
            prompt_tokens=prompt_tokens,
            bias_rows=bias_rows,
            bias_tokens=bias_tokens,
            bias_values=bias_values,
            banned_rows=banned_rows,
            banned_tokens=banned_tokens,
            penalized=penalized,
        )


def penalty_rows(
    seqs: Sequence[Seq],
    ends: Sequence[int],  # per row: tokens before the one sampled (the chunk's end)
    eos_token_ids: Collection[int],
) -> PenaltyRows | None:
    """The step's penalties, or None when no row asks for any (the step pays nothing)."""
    if not any(_adjusts(s) for s in seqs):
        return None
    presence, frequency, repetition = [], [], []
    counted: tuple[list[int], list[int]] = ([], [])
    prompt: tuple[list[int], list[int]] = ([], [])
    bias: tuple[list[int], list[int]] = ([], [])
    bias_values: list[float] = []
    banned: tuple[list[int], list[int]] = ([], [])
    for row, (seq, end) in enumerate(zip(seqs, ends, strict=True)):
        p = seq.params
        presence.append(p.presence_penalty)
        frequency.append(p.frequency_penalty)
        repetition.append(p.repetition_penalty)
        # The completion so far: what precedes the token sampled, whatever was recomputed.
        generated = end - seq.num_prompt_tokens
        if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
            _pairs(counted, row, seq.output_token_ids[:generated])
        if p.repetition_penalty != 1.0:
            _pairs(prompt, row, seq.prompt_token_ids)
        if p.logit_bias:
            _pairs(bias, row, [token for token, _ in p.logit_bias])
            bias_values.extend(value for _, value in p.logit_bias)
        if generated < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            _pairs(banned, row, sorted(stops))
    return PenaltyRows(
        presence=presence,
        frequency=frequency,
        repetition=repetition,
        counted=counted,
        prompt=prompt,
        bias=bias,
        bias_values=bias_values,
        banned=banned,
        penalized=any(presence) or any(frequency) or any(r != 1.0 for r in repetition),
    )


def _adjusts(seq: Seq) -> bool:
    p = seq.params
    return bool(
        p.presence_penalty
        or p.frequency_penalty
        or p.repetition_penalty != 1.0
        or p.logit_bias
        or p.min_tokens
    )


def _pairs(into: tuple[list[int], list[int]], row: int, tokens: Sequence[int]) -> None:
    into[0].extend([row] * len(tokens))
    into[1].extend(tokens)


def apply_penalties(
    logits: torch.Tensor,  # [rows, vocab] float32
    t: PenaltyTensors | None,
) -> torch.Tensor:  # [rows, vocab] float32, a new tensor (`logits` is left as it was)
    if t is None:
        return logits
    logits = logits.index_put(
        (t.banned_rows, t.banned_tokens),
        logits.new_full(t.banned_tokens.shape, float("-inf")),
    )
    logits = logits.index_put((t.bias_rows, t.bias_tokens), t.bias_values, accumulate=True)
    if not t.penalized:
        return logits
    counts = torch.zeros_like(logits).index_put_(  # [rows, vocab]: completion counts
        (t.counted_rows, t.counted_tokens),
        torch.ones_like(t.counted_tokens, dtype=logits.dtype),
        accumulate=True,
    )
    in_output = counts > 0  # [rows, vocab]
    seen = torch.zeros_like(in_output).index_put_(
        (t.prompt_rows, t.prompt_tokens), torch.ones_like(t.prompt_tokens, dtype=torch.bool)
    )
    seen |= in_output
    r = t.repetition.unsqueeze(1)  # [rows, 1]
    logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    return logits - t.frequency.unsqueeze(1) * counts - t.presence.unsqueeze(1) * in_output
