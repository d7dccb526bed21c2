"""Attention over the paged KV pool, for a step that mixes decodes and prefill chunks.

The runner builds one `AttentionMetadata` per step (all index tensors, on the device); every
layer reuses it. Tokens of the step are laid out flat: the decode tokens first (one per
sequence), then each prefill chunk's tokens in order.

A sequence's context is read block by block into the pool's gather workspace (`index_select`
into preallocated memory), then attended with SDPA. Decodes of all sequences share one SDPA
call; their query heads are grouped by KV head, so grouped-query attention needs no copy of K/V
per query head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu.kv_pool import LayerKV


@dataclass(frozen=True)
class PrefillSpan:
    """One prefill chunk: rows `begin:end` of the step, at positions `start .. start + n - 1`."""

    begin: int
    end: int
    context: int  # start + n: how many positions the chunk attends to
    blocks: torch.Tensor | None  # [ceil(context / block_size)] the block table's head; None
    # when the chunk is the whole context (start == 0): it attends to its own K/V directly.
    mask: torch.Tensor | None  # [n, context] bool, True = may attend; None = plain causal


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] flat slot receiving each new token's K/V
    num_decodes: int
    decode_blocks: torch.Tensor | None  # [decodes * width] block tables, padded with block 0
    decode_mask: torch.Tensor | None  # [decodes, 1, 1, width * block_size] bool
    prefills: tuple[PrefillSpan, ...]


def gather_blocks(
    pool: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    work: torch.Tensor,  # [workspace_blocks, block_size, kv_heads, head_dim]
    blocks: torch.Tensor,  # [n]
) -> torch.Tensor:  # [n * block_size, kv_heads, head_dim], a view of `work`
    out = work[: blocks.numel()]
    torch.index_select(pool, 0, blocks, out=out)
    return out.flatten(0, 1)


def paged_attention(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    k: torch.Tensor,  # [tokens, kv_heads, head_dim]
    v: torch.Tensor,  # [tokens, kv_heads, head_dim]
    kv: LayerKV,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [tokens, heads, head_dim]
    kv.k.view(-1, *k.shape[1:]).index_copy_(0, meta.slot_mapping, k)
    kv.v.view(-1, *v.shape[1:]).index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    d = meta.num_decodes
    if d:
        assert meta.decode_blocks is not None
        kv_heads, head_dim = k.shape[1:]
        group = q.shape[1] // kv_heads
        qd = q[:d].view(d, kv_heads, group, head_dim)  # query heads grouped by their KV head
        kd = gather_blocks(kv.k, kv.k_work, meta.decode_blocks)
        vd = gather_blocks(kv.v, kv.v_work, meta.decode_blocks)
        kd = kd.view(d, -1, kv_heads, head_dim).transpose(1, 2)  # [d, kv_heads, ctx, head_dim]
        vd = vd.view(d, -1, kv_heads, head_dim).transpose(1, 2)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale)
        out[:d] = od.reshape(d, -1, head_dim)  # [d, heads, head_dim]
    for span in meta.prefills:
        qp = q[span.begin : span.end].transpose(0, 1)  # [heads, n, head_dim]
        if span.blocks is None:
            kp = k[span.begin : span.end].transpose(0, 1)  # [kv_heads, n, head_dim]
            vp = v[span.begin : span.end].transpose(0, 1)
        else:
            kp = gather_blocks(kv.k, kv.k_work, span.blocks)[: span.context].transpose(0, 1)
            vp = gather_blocks(kv.v, kv.v_work, span.blocks)[: span.context].transpose(0, 1)
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
