"""Logprobs of sampled tokens: each one's own and its row's top-k, from the raw logits.

Which logits: the model's own, as the forward returns them (float32), before temperature,
top-k / top-p, penalties, biases and grammar masks change them. That is vLLM's default
(`logprobs_mode="raw_logprobs"`): a token's logprob does not depend on the temperature it was
sampled at, and a token a grammar forced still shows the probability the model gave it.

Prompt logprobs (`prompt_logprobs`): a prefill chunk of a request that asks for them has a
logits row at each position whose next token is a prompt token; each row's log-softmax is
gathered at that token and its top-k taken, and the values come back in the same single read
(`read_step`). Position p's logits score prompt token p + 1; the first prompt token has none.

Only steps where some row asks pay: `raw_logprobs` returns None when none does. On such a step
every sampled row is computed (picking the asking rows would need their indices on the device,
a copy that waits for it), and the tokens come back in the same single read as the logprobs
(`read_sampled`), so the step still reads the device once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    rows = _pack_sampled(tokens, raw).tolist()  # the step's one read: tokens and logprobs
    return _unpack_sampled(rows, raw)


def _pack_sampled(tokens: torch.Tensor, raw: RawLogprobs) -> torch.Tensor:  # [rows, 2 + 2k]
    chosen = raw.logp.gather(-1, tokens.unsqueeze(-1))  # [rows, 1]
    dtype = _id_dtype(raw.logp.shape[-1])
    columns = [tokens.unsqueeze(-1), chosen, raw.top_values, raw.top_ids]
    return torch.cat([c.to(dtype) for c in columns], dim=-1)


def _unpack_sampled(
    rows: list[list[float]], raw: RawLogprobs
) -> tuple[list[int], list[TokenLogprob | None]]:
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


def _id_dtype(vocab: int) -> torch.dtype:
    # float32 holds every id below 2^24 exactly (any vocabulary we serve); float64 any id
    return torch.float32 if vocab <= 1 << 24 else torch.float64


# Prompt rows log-softmaxed at once: a chunk may score hundreds of positions, and each pass
# holds float32 copies of its rows' logits; this many keeps them within what sampling's rows use.
PROMPT_ROWS_PER_PASS = 64


def prompt_logprobs(
    logits: torch.Tensor,  # [rows, vocab] float32: prompt positions' logits, as the model's
    targets: torch.Tensor,  # [rows] int64: the prompt token each row scores (the next one)
    k: int,  # alternatives per row (the most any scored request asks for)
) -> torch.Tensor:  # [rows, 1 + 2k]: the target's logprob, top-k values, top-k ids
    """Each row's log-softmax at its target and its top `k`, packed for `read_step`
    (`PROMPT_ROWS_PER_PASS` rows at a time)."""
    dtype = _id_dtype(logits.shape[-1])
    k = min(k, logits.shape[-1])
    packed = []
    for begin in range(0, logits.shape[0], PROMPT_ROWS_PER_PASS):
        rows = slice(begin, begin + PROMPT_ROWS_PER_PASS)
        logp = torch.log_softmax(logits[rows].float(), dim=-1)  # [pass rows, vocab]
        chosen = logp.gather(-1, targets[rows].unsqueeze(-1))  # [pass rows, 1]
        top = logp.topk(k, dim=-1)  # [pass rows, k] each
        columns = [chosen, top.values, top.indices]
        packed.append(torch.cat([c.to(dtype) for c in columns], dim=-1))
    if len(packed) == 1:
        return packed[0]
    return torch.cat(packed) if packed else logits.new_empty((0, 1 + 2 * k), dtype=dtype)


def unpack_prompt_row(row: Sequence[float], k: int) -> TokenLogprob:
    """One `prompt_logprobs` row (read back) as the `TokenLogprob` of a request asking `k`."""
    width = (len(row) - 1) // 2
    k = min(k, width)
    ids = row[1 + width : 1 + width + k]
    return TokenLogprob(row[0], tuple(map(int, ids)), tuple(row[1 : 1 + k]))


def read_step(
    tokens: torch.Tensor,  # [rows] int64, the sampled ids
    raw: RawLogprobs | None,
    prompt: torch.Tensor,  # [prompt rows, 1 + 2k] from `prompt_logprobs`
) -> tuple[list[int], list[TokenLogprob | None], list[list[float]]]:
    """The sampled ids, their logprobs (None per row that asks none, or every row when `raw`
    is None) and the prompt rows, in one read from the device."""
    dtype = prompt.dtype
    head = tokens.unsqueeze(-1).to(dtype) if raw is None else _pack_sampled(tokens, raw)
    width = head.shape[-1]
    flat = torch.cat([head.flatten().to(dtype), prompt.flatten()]).tolist()  # the one read
    split = head.shape[0] * width
    rows = [flat[i : i + width] for i in range(0, split, width)]
    step = prompt.shape[-1]
    prompt_rows = [flat[i : i + step] for i in range(split, len(flat), step)]
    if raw is None:
        return [int(r[0]) for r in rows], [None] * len(rows), prompt_rows
    ids, sampled = _unpack_sampled(rows, raw)
    return ids, sampled, prompt_rows


@dataclass(frozen=True)
class CompletionLogprobs:
    """A completion's logprobs, one entry per token of its `token_ids`, with the texts of the
    tokens (each decoded alone, special tokens included: a token that is part of a UTF-8
    character reads as U+FFFD, as in vLLM).

    A prompt's (`of_prompt`) has one entry per prompt token and `unscored_first` set: no
    logits score the first prompt token, so entry 0 is a placeholder (logprob 0.0, no
    alternatives) that readers show as null."""

    tokens: list[str]
    token_logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    top_tokens: list[list[str]]
    unscored_first: bool = False
    token_ids: list[int] = field(default_factory=list)  # a prompt's: the ids of its tokens

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

    @classmethod
    def of_prompt(
        cls,
        prompt_ids: Sequence[int],
        entries: Sequence[TokenLogprob],  # entry i scores prompt token i + 1
        decode: Callable[[int], str],
    ) -> CompletionLogprobs:
        """One entry per prompt token scored so far (all but an aborted request's), after
        the first's placeholder."""
        first = cls.of(prompt_ids[:1], [TokenLogprob(0.0)], decode)
        rest = cls.of(prompt_ids[1 : 1 + len(entries)], entries, decode)
        return cls(
            tokens=first.tokens + rest.tokens,
            token_logprobs=first.token_logprobs + rest.token_logprobs,
            top_ids=first.top_ids + rest.top_ids,
            top_logprobs=first.top_logprobs + rest.top_logprobs,
            top_tokens=first.top_tokens + rest.top_tokens,
            unscored_first=True,
            token_ids=list(prompt_ids[: 1 + len(entries)]),
        )
