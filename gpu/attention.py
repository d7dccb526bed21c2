"""Attention over the paged KV pool, for a step that mixes decodes and prefill chunks.

The runner builds one `AttentionMetadata` per step (all index tensors, on the device); every
layer reuses it. Tokens of the step are laid out flat: the decode tokens first (one per
sequence), then each prefill chunk's tokens in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PrefillSpan:
    """One prefill chunk: rows `begin:end` of the step, at positions `start .. start + n - 1`."""

    begin: int
    end: int
    context_slots: torch.Tensor | None  # [context] flat slots of positions 0 .. start + n - 1;
    # None when the chunk is the whole context (start == 0): attend to its own K/V directly.
    mask: torch.Tensor | None  # [n, context] bool, True = may attend; None = plain causal


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] flat slot receiving each new token's K/V
    num_decodes: int
    decode_slots: torch.Tensor | None  # [decodes, max_context] flat slots, padded with 0
    decode_mask: torch.Tensor | None  # [decodes, 1, 1, max_context] bool, False on padding
    prefills: tuple[PrefillSpan, ...]


def paged_attention(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    k: torch.Tensor,  # [tokens, kv_heads, head_dim]
    v: torch.Tensor,  # [tokens, kv_heads, head_dim]
    k_cache: torch.Tensor,  # [slots, kv_heads, head_dim]
    v_cache: torch.Tensor,  # [slots, kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [tokens, heads, head_dim]
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    d = meta.num_decodes
    if d:
        assert meta.decode_slots is not None
        qd = q[:d].unsqueeze(2)  # [d, heads, 1, head_dim]
        kd = k_cache[meta.decode_slots].transpose(1, 2)  # [d, kv_heads, context, head_dim]
        vd = v_cache[meta.decode_slots].transpose(1, 2)
        od = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        )
        out[:d] = od.squeeze(2)
    for span in meta.prefills:
        qp = q[span.begin : span.end].transpose(0, 1)  # [heads, n, head_dim]
        if span.context_slots is None:
            kp = k[span.begin : span.end].transpose(0, 1)  # [kv_heads, n, head_dim]
            vp = v[span.begin : span.end].transpose(0, 1)
        else:
            kp = k_cache[span.context_slots].transpose(0, 1)  # [kv_heads, context, head_dim]
            vp = v_cache[span.context_slots].transpose(0, 1)
        op = F.scaled_dot_product_attention(
            qp,
            kp,
            vp,
            attn_mask=span.mask,
            is_causal=span.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[span.begin : span.end] = op.transpose(0, 1)
    return out
