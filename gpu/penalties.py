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

Only the logits of tokens a row has seen change, so the penalties touch only those: every step
the host lists, for each penalized row, the distinct tokens it has seen (the completion's, and
the prompt's too under a repetition penalty) with each one's count in the completion, and
these (row, token, count) triples go to the device in the step's one host→device copy; there
the seen logits are gathered, penalized and written back. Nothing of [rows, vocab] size is
built besides the one copy of the logits every adjustment makes: dense counts cost 150 ms a
step at 64 rows × 49,152 on this project's 2-core CPU host (large fresh temporaries); the
triples 1.2 ms, or 11 ms with a repetition penalty over 1,024-token prompts (64 rows, 256
completion tokens each; the host's sets and counts: 1.6 and 17 ms, both measured on a loaded
host). Each pair is listed once, so the writes never collide. No state lives on the device
between steps, so nothing can go stale: a preempted and recomputed sequence, a chunked
prefill, a sequence re-prefilled past LongRoPE's original length all count exactly the tokens
before the position sampled. (Counts kept incrementally on the device would save the host's
work but need a slot per sequence and their own bookkeeping under preemption, forks and
recompute.)

A step none of whose rows asks for any of these stages nothing and runs none of this
(`penalty_rows` returns None); in a step where some do, the others have no triples and keep
their logits bit for bit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from gpu.sequence import Sequence as Seq


@dataclass(frozen=True)
class PenaltyRows:
    """One step's penalties as host lists (per row, or per (row, token) pair), for a backend
    to stage with the step's inputs. `penalized`: some row has seen tokens to penalize."""

    presence: list[float]
    frequency: list[float]
    repetition: list[float]
    seen: tuple[list[int], list[int]]  # distinct (row, token) pairs a penalty applies to
    counts: list[float]  # per seen pair: its count in the completion (0: the prompt's only)
    bias: tuple[list[int], list[int]]  # (rows, tokens) with a logit bias
    bias_values: list[float]
    banned: tuple[list[int], list[int]]  # (rows, tokens) at -inf for min_tokens
    penalized: bool

    def lists(self) -> list[tuple[list[int] | list[float], bool]]:
        """Each list in `PenaltyTensors`' field order, and whether it holds floats."""
        floats = [self.presence, self.frequency, self.repetition]
        return [
            *((values, True) for values in floats),
            *((values, False) for values in self.seen),
            (self.counts, True),
            *((values, False) for values in self.bias),
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
    """`PenaltyRows` on the device: [rows] float32 per-row values, [pairs] indices and values."""

    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor
    seen_rows: torch.Tensor  # int64
    seen_tokens: torch.Tensor  # int64
    counts: torch.Tensor  # float32
    bias_rows: torch.Tensor
    bias_tokens: torch.Tensor
    bias_values: torch.Tensor  # float32
    banned_rows: torch.Tensor
    banned_tokens: torch.Tensor
    penalized: bool  # a host flag: some row has seen tokens to penalize

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor], penalized: bool) -> PenaltyTensors:
        """From tensors in field order (`PenaltyRows.lists`)."""
        presence, frequency, repetition, seen_rows, seen_tokens, counts, *rest = tensors
        bias_rows, bias_tokens, bias_values, banned_rows, banned_tokens = rest
        return cls(
            presence=presence,
            frequency=frequency,
            repetition=repetition,
            seen_rows=seen_rows,
            seen_tokens=seen_tokens,
            counts=counts,
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
    seen: tuple[list[int], list[int]] = ([], [])
    counts: list[float] = []
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
            counted = Counter(seq.output_token_ids[:generated])
            _pairs(seen, row, list(counted))
            counts.extend(counted.values())
            if p.repetition_penalty != 1.0:  # the prompt's tokens too, counted 0
                prompt_only = set(seq.prompt_token_ids).difference(counted)
                _pairs(seen, row, list(prompt_only))
                counts.extend([0.0] * len(prompt_only))
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
        seen=seen,
        counts=counts,
        bias=bias,
        bias_values=bias_values,
        banned=banned,
        penalized=bool(counts),
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
) -> torch.Tensor:  # [rows, vocab] float32; `logits` itself is never written
    if t is None:
        return logits
    logits = logits.index_put(
        (t.banned_rows, t.banned_tokens),
        logits.new_full(t.banned_tokens.shape, float("-inf")),
    )
    logits.index_put_((t.bias_rows, t.bias_tokens), t.bias_values, accumulate=True)
    if not t.penalized:
        return logits
    seen = logits[t.seen_rows, t.seen_tokens]  # [pairs]; each (row, token) once
    r = t.repetition[t.seen_rows]  # [pairs]
    seen = torch.where(seen > 0, seen / r, seen * r)
    seen = seen - t.frequency[t.seen_rows] * t.counts - t.presence[t.seen_rows] * (t.counts > 0)
    return logits.index_put_((t.seen_rows, t.seen_tokens), seen)
