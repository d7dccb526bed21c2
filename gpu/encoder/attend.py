"""The arithmetic of the encoder's attention: packed sequences, each attending to itself.

A step's sequences are planned once per step and kind of layer (`plan`): the short ones (no
key out of reach) are padded into a few batches of similar lengths, one SDPA call each with a
mask over the padding; a long one runs alone, in query chunks that multiply only the keys in
reach of a sliding layer. Few calls per layer, whatever the number of inputs: each call has a
fixed cost (a parallel region, buffers), which dominates short inputs attended one by one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu.backends.layer_ops import AttentionShape, split_heads
from gpu.backends.metadata import PrefillSpan

CHUNK = 256  # queries per SDPA call on a sequence longer than a sliding layer's reach
SHORT = 512  # a sequence this long or shorter may be padded into a batch (a full layer's)
BATCH_TOKENS = 8192  # the most padded rows of one batch
FILL = 0.75  # a batch's shortest sequence is at least this share of its longest


@dataclass(frozen=True)
class Batch:
    """Short sequences padded to one width and attended in one call."""

    slots: torch.Tensor  # [sequences × width] int64 the packed row in each slot (padding: 0)
    kept: torch.Tensor  # [tokens] int64 the slots holding tokens, in packed-row order
    rows: torch.Tensor  # [tokens] int64 their packed rows
    padding: torch.Tensor | None  # [sequences, 1, 1, width] float 0 or -inf; None: no padding
    sequences: int
    width: int


@dataclass(frozen=True)
class Plan:
    """How one step's sequences are attended in layers of one reach."""

    batches: tuple[Batch, ...]
    alone: tuple[PrefillSpan, ...]  # long sequences, one by one


def plan(spans: Sequence[PrefillSpan], side: int | None, device: torch.device) -> Plan:
    """Short spans (every key in reach: at most `side` + 1 tokens, and SHORT) into batches of
    similar lengths, longest first; the rest alone."""
    limit = SHORT if side is None else min(SHORT, side + 1)
    short = sorted((s for s in spans if s.end - s.begin <= limit), key=lambda s: s.begin - s.end)
    alone = tuple(s for s in spans if s.end - s.begin > limit)
    batches: list[Batch] = []
    group: list[PrefillSpan] = []
    for span in [*short, None]:
        if group:
            width = group[0].end - group[0].begin
            n = 0 if span is None else span.end - span.begin
            if span is None or n < FILL * width or (len(group) + 1) * width > BATCH_TOKENS:
                batches.append(_batch(group, width, device))
                group = []
        if span is not None:
            group.append(span)
    return Plan(tuple(batches), alone)


def _batch(group: list[PrefillSpan], width: int, device: torch.device) -> Batch:
    slots: list[int] = []  # see Batch
    kept: list[int] = []
    rows: list[int] = []
    pad: list[list[float]] = []
    for i, span in enumerate(group):
        n = span.end - span.begin
        slots += [*range(span.begin, span.end), *[0] * (width - n)]
        kept += range(i * width, i * width + n)
        rows += range(span.begin, span.end)
        pad.append([0.0] * n + [float("-inf")] * (width - n))
    index = torch.tensor([kept, rows], dtype=torch.int64).to(device)
    mask = None
    if len(kept) < len(slots):
        mask = torch.tensor(pad).view(len(group), 1, 1, width).to(device)
    slot_rows = torch.tensor(slots, dtype=torch.int64).to(device)
    return Batch(slot_rows, index[0], index[1], mask, len(group), width)


def attend_batch(
    qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size] the step's, packed, rotated
    shape: AttentionShape,
    batch: Batch,
    out: torch.Tensor,  # [tokens, heads, head_dim], the batch's rows written
) -> None:
    b, w = batch.sequences, batch.width
    q, k, v = split_heads(qkv[batch.slots], shape)  # [slots, heads, head_dim], gathered
    # [sequences, heads, width, head_dim]
    qb, kb, vb = (t.view(b, w, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
    o = sdpa(qb, kb, vb, batch.padding, shape.scale, shape.softcap)
    flat = o.transpose(1, 2).reshape(b * w, shape.heads, shape.head_dim)  # [slots, ...]
    out[batch.rows] = flat if batch.padding is None else flat[batch.kept]


def attend_alone(
    q: torch.Tensor,  # [n, heads, head_dim] one sequence
    k: torch.Tensor,  # [n, kv_heads, head_dim]
    v: torch.Tensor,
    side: int | None,  # a query sees keys within `side` positions; None: all
    scale: float,
    softcap: float | None,
    out: torch.Tensor,  # [n, heads, head_dim], written
) -> None:
    """One sequence's attention, in query chunks where a window leaves enough keys out of
    reach to pay for the calls (a sequence longer than CHUNK + 2 side)."""
    n = q.shape[0]
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, n, head_dim]
    if side is None or n <= side + 1:  # every key in reach of every query
        o = sdpa(qh, kh, vh, None, scale, softcap)
    elif n <= CHUNK + 2 * side:  # one call: chunks would multiply as many keys
        o = sdpa(qh, kh, vh, _band(side, q.device)[:n, side : side + n], scale, softcap)
    else:
        band = _band(side, q.device)
        chunks = []
        for a in range(0, n, CHUNK):
            b = min(n, a + CHUNK)
            lo, hi = max(0, a - side), min(n, b + side)  # keys in reach of a .. b - 1
            shift = side - (a - lo)  # the band's column of key lo, for query a
            mask = band[: b - a, shift : shift + hi - lo]
            qc, kc, vc = qh[:, :, a:b], kh[:, :, lo:hi], vh[:, :, lo:hi]
            chunks.append(sdpa(qc, kc, vc, mask, scale, softcap))  # [1, heads, b - a, dim]
        o = torch.cat(chunks, dim=2)
    out.copy_(o[0].transpose(0, 1))  # one copy: each is a parallel region


def sdpa(
    q: torch.Tensor,  # [batch, heads, m, head_dim]
    k: torch.Tensor,  # [batch, kv_heads, keys, head_dim]
    v: torch.Tensor,
    mask: torch.Tensor | None,  # added to the scores ([.., m or 1, keys]: 0 or -inf)
    scale: float,
    softcap: float | None,
) -> torch.Tensor:  # [batch, heads, m, head_dim]
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        )
    groups = q.shape[1] // k.shape[1]  # soft-capped scores: SDPA has no such option
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = softcap * torch.tanh((q @ k.transpose(-1, -2)) * scale / softcap)
    if mask is not None:
        scores = scores + mask
    return scores.softmax(-1) @ v


@functools.lru_cache(maxsize=8)
def _band(side: int, device: torch.device) -> torch.Tensor:
    """[CHUNK + 2 side, CHUNK + 3 side] float: 0 where query i, at key column i + side,
    reaches key j (|i + side - j| <= side), else -inf. A chunk's mask is a slice of its first
    CHUNK rows; a sequence of n alone, rows :n of columns side : side + n. (SDPA takes a float
    mask as it is; a boolean one it converts on every call.)"""
    q = torch.arange(CHUNK + 2 * side, device=device).unsqueeze(1) + side
    k = torch.arange(CHUNK + 3 * side, device=device).unsqueeze(0)
    near = (q - k).abs() <= side
    return torch.zeros(near.shape, device=device).masked_fill(~near, float("-inf"))
