"""Logprobs of sampled tokens: each one's own and its row's top-k, from the raw logits.

Which logits: the model's own, as the forward returns them (float32), before temperature,
top-k / top-p, penalties, biases and grammar masks change them. That is vLLM's default
(`logprobs_mode="raw_logprobs"`): a token's logprob does not depend on the temperature it was
sampled at, and a token a grammar forced still shows the probability the model gave it.

Only steps where some row asks pay: `raw_logprobs` returns None when none does. On such a step
every sampled row is computed (picking the asking rows would need their indices on the device,
a copy that waits for it), and the tokens come back in the same single read as the logprobs
(`read_sampled`), so the step still reads the device once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


class TokenLogprob(NamedTuple):
    """One sampled token's logprob and its row's `k` most likely tokens, most likely first.
    (A named tuple: one is made per sampled token of every asking row, each step.)"""

    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class RawLogprobs:
    """A step's log-softmax of its sampled rows, and the top `k` of each (k: the most any
    row asks for)."""

    logp: torch.Tensor  # [rows, vocab] float32
    top_values: torch.Tensor  # [rows, k] float32, descending
    top_ids: torch.Tensor  # [rows, k] int64
    ks: tuple[int | None, ...]  # each row's k; None: it asks for none


def raw_logprobs(
    logits: torch.Tensor,  # [rows, vocab] float32, as the model returned them
    ks: Sequence[int | None],  # per row: how many alternatives (0: only its token's); None: off
) -> RawLogprobs | None:
    """The log-softmax and top-k of `logits`, or None when no row asks (nothing computed).

    Call before anything changes the logits: these are the values reported."""
    if all(k is None for k in ks):
        return None
    k = min(max(k or 0 for k in ks), logits.shape[-1])
    logp = torch.log_softmax(logits.float(), dim=-1)  # [rows, vocab]
    top = logp.topk(k, dim=-1)  # [rows, k] each; k may be 0
    return RawLogprobs(logp, top.values, top.indices, tuple(ks))


def read_sampled(
    tokens: torch.Tensor,  # [rows] int64, the sampled ids
    raw: RawLogprobs,
) -> tuple[list[int], list[TokenLogprob | None]]:
    """The sampled ids and each asking row's `TokenLogprob`, in one read from the device.

    One float tensor carries ids and values: float32 holds every id below 2^24 exactly (any
    vocabulary we serve), float64 any id; the values are float32's either way."""
    chosen = raw.logp.gather(-1, tokens.unsqueeze(-1))  # [rows, 1]
    dtype = torch.float32 if raw.logp.shape[-1] <= 1 << 24 else torch.float64
    columns = [tokens.unsqueeze(-1), chosen, raw.top_values, raw.top_ids]
    packed = torch.cat([c.to(dtype) for c in columns], dim=-1)  # [rows, 2 + 2k]
    rows = packed.tolist()  # the step's one read: tokens and logprobs together
    width = raw.top_ids.shape[-1]
    ids: list[int] = []
    out: list[TokenLogprob | None] = []
    for row, k in zip(rows, raw.ks, strict=True):
        ids.append(int(row[0]))
        if k is None:
            out.append(None)
            continue
        k = min(k, width)
        values = row[2 : 2 + k]
        top_ids = row[2 + width : 2 + width + k]
        out.append(TokenLogprob(row[1], tuple(map(int, top_ids)), tuple(values)))
    return ids, out


@dataclass(frozen=True)
class CompletionLogprobs:
    """A completion's logprobs, one entry per token of its `token_ids`, with the texts of the
    tokens (each decoded alone, special tokens included: a token that is part of a UTF-8
    character reads as U+FFFD, as in vLLM)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    top_tokens: list[list[str]]

    @classmethod
    def of(
        cls,
        token_ids: Sequence[int],
        entries: Sequence[TokenLogprob],
        decode: Callable[[int], str],  # one token id's text (the engine's cached decoding)
    ) -> CompletionLogprobs:
        return cls(
            tokens=[decode(t) for t in token_ids],
            token_logprobs=[e.logprob for e in entries],
            top_ids=[list(e.top_ids) for e in entries],
            top_logprobs=[list(e.top_logprobs) for e in entries],
            top_tokens=[[decode(t) for t in e.top_ids] for e in entries],
        )
