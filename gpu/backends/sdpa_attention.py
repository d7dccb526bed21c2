"""Attention over the paged KV pool, for a step that mixes decodes and prefill chunks.

The backend builds one `AttentionMetadata` per step (`gpu/backends/metadata.py`); every layer
reuses it. Given a kernel library (`kernels`: the native CPU kernels, or Triton's), decodes
attend with its kernel, which reads each sequence's blocks where they lie in the pool: no
copy, one call for all decodes. The native kernels take all of a step's prefill chunks in one
call too (`span_attention`): a chunk with no cached context over its own q, k, v rows, one that
continues a context over its keys in the pool, through its block table. Triton attends a
chunk over cached context in the pool (`paged_prefill_attention`). Otherwise (the torch
backend) a chunk's context is read block by block into the pool's gather workspace
(`index_select` into preallocated memory), then attended with SDPA, and decodes share one
SDPA call per group of similar context lengths; their query heads are grouped by KV head, so
grouped-query attention needs no copy of K/V per query head.

Sliding-window layers (a query at p sees positions (p - window, p]) attend through
`meta.local`, the same step seen through the window: decode groups whose `starts` tell the
native kernel where to begin, gathers of only the window's blocks, windowed masks. Blocks
older than the window are never read. Soft-capped scores (Gemma 2) cannot go through SDPA:
those models attend over the same gathered blocks with the scores computed in torch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpu.backends.metadata import AttentionMetadata
from gpu.kernels.step_kernels import ChunkTables, StepKernels
from gpu.kv_pool import LayerKV

if TYPE_CHECKING:  # imports torch._dynamo: only where it is used (`_lower_right`)
    from torch.nn.attention.bias import CausalBias


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
    softcap: float | None = None,  # scores = softcap · tanh(scores / softcap) before softmax
    *,
    kernels: StepKernels | None = None,  # decode (and prefill) attention in place in the pool
    kv_written: bool = False,  # k and v are already in the pool (a fused rotary + write)
) -> torch.Tensor:  # [tokens, heads, head_dim]
    if not kv_written:
        kv.k.view(-1, *k.shape[1:]).index_copy_(0, meta.slot_mapping, k)
        kv.v.view(-1, *v.shape[1:]).index_copy_(0, meta.slot_mapping, v)
    out = q.new_empty(q.shape)  # contiguous, whatever q's strides
    with _pinned_sdpa(q.device):
        _decode_groups(q, kv, meta, scale, softcap, kernels, out)
        _prefill_spans(q, k, v, kv, meta, scale, softcap, kernels, out)
    return out


def _decode_groups(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    kv: LayerKV,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None,
    kernels: StepKernels | None,
    out: torch.Tensor,  # [tokens, heads, head_dim], the decodes' rows written
) -> None:
    kv_heads, head_dim = kv.k.shape[2:]
    per_kv_head = q.shape[1] // kv_heads
    for group in meta.decodes:
        d = group.end - group.begin
        if group.mask is None:
            assert kernels is not None, "a decode group without a mask needs the kernel"
            kernels.paged_decode_attention(
                q[group.begin : group.end].contiguous(),
                kv.k,
                kv.v,
                group.blocks.view(d, -1),
                group.lengths,
                scale,
                out[group.begin : group.end],
                starts=group.starts,
                softcap=softcap,
            )
            continue
        # Query heads grouped by the KV head they share: [d, kv_heads, per_kv_head, head_dim].
        qd = q[group.begin : group.end].view(d, kv_heads, per_kv_head, head_dim)
        kd = gather_blocks(kv.k, kv.k_work, group.blocks)
        vd = gather_blocks(kv.v, kv.v_work, group.blocks)
        kd = kd.view(d, -1, kv_heads, head_dim).transpose(1, 2)  # [d, kv_heads, ctx, head_dim]
        vd = vd.view(d, -1, kv_heads, head_dim).transpose(1, 2)
        if softcap is None:
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=group.mask, scale=scale)
        else:  # one query a sequence: [d, kv_heads, per_kv_head, 1, head_dim]
            mask = group.mask.unsqueeze(1)  # [d, 1, 1, 1, ctx]
            od = softcapped_attention(
                qd.unsqueeze(-2), kd.unsqueeze(2), vd.unsqueeze(2), mask, scale, softcap
            )
        out[group.begin : group.end] = od.reshape(d, -1, head_dim)  # [d, heads, head_dim]


def _prefill_spans(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    k: torch.Tensor,  # [tokens, kv_heads, head_dim]
    v: torch.Tensor,
    kv: LayerKV,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None,
    kernels: StepKernels | None,
    out: torch.Tensor,  # [tokens, heads, head_dim], the prefills' rows written
) -> None:
    kv_heads, head_dim = kv.k.shape[2:]
    per_kv_head = q.shape[1] // kv_heads
    prefill_kernel = getattr(kernels, "paged_prefill_attention", None)
    spans = meta.prefills
    own_rows = getattr(kernels, "span_attention", None)
    if own_rows is not None and spans:  # every chunk in one call (native CPU)
        bounds = torch.tensor([[s.begin for s in spans], [s.end for s in spans]])
        before = None if meta.window is None else meta.window - 1
        pooled = [s.blocks for s in spans if s.blocks is not None]
        tables = None
        if pooled:  # chunks continuing a cached context read their keys in the pool
            offsets, at = [], 0
            for s in spans:
                offsets.append(-1 if s.blocks is None else at)
                at += 0 if s.blocks is None else s.blocks.numel()
            tables = ChunkTables(
                keys=torch.tensor([s.context for s in spans]),
                offsets=torch.tensor(offsets),
                tables=torch.cat(pooled),
            )
        own_rows(
            q, k, v, bounds, scale, out, before=before, after=0, softcap=softcap,
            pool=(kv.k, kv.v), tables=tables,
        )  # fmt: skip
        return
    for span in spans:
        n = span.end - span.begin
        if span.blocks is not None and prefill_kernel is not None:
            # A chunk over cached context, read where it lies in the pool (Triton on CUDA).
            prefill_kernel(
                q[span.begin : span.end].contiguous(),
                kv.k,
                kv.v,
                span.blocks,
                span.context,
                scale,
                out[span.begin : span.end],
                window=meta.window,
                softcap=softcap,
            )
            continue
        # 4-D [1, heads, n, head_dim]: the layout fused SDPA kernels (flash, memory-efficient)
        # take on CUDA; 3-D inputs would fall back to the unfused math kernel.
        qp = q[span.begin : span.end].transpose(0, 1).unsqueeze(0)
        if span.blocks is None:
            kp = k[span.begin : span.end].transpose(0, 1)  # [kv_heads, n, head_dim]
            vp = v[span.begin : span.end].transpose(0, 1)
        else:
            kp = gather_blocks(kv.k, kv.k_work, span.blocks)[: span.context].transpose(0, 1)
            vp = gather_blocks(kv.v, kv.v_work, span.blocks)[: span.context].transpose(0, 1)
        if softcap is not None:
            mask = span.mask if span.mask is not None else _causal(n, span.context, q.device)
            # [kv_heads, per_kv_head, n, head_dim] against [kv_heads, 1, context, head_dim]
            qg = qp[0].view(kv_heads, per_kv_head, n, head_dim)
            og = softcapped_attention(qg, kp.unsqueeze(1), vp.unsqueeze(1), mask, scale, softcap)
            out[span.begin : span.end] = og.reshape(-1, n, head_dim).transpose(0, 1)
            continue
        bias: torch.Tensor | CausalBias | None = span.mask
        if bias is None and span.blocks is not None:
            bias = _lower_right(n, span.context, q.device)
        op = F.scaled_dot_product_attention(
            qp,
            kp.unsqueeze(0),
            vp.unsqueeze(0),
            attn_mask=bias,
            is_causal=bias is None,
            scale=scale,
            enable_gqa=True,
        )  # [1, heads, n, head_dim]
        out[span.begin : span.end] = op[0].transpose(0, 1)


def _lower_right(n: int, context: int, device: torch.device) -> torch.Tensor | CausalBias:
    """The lower-right causal bias of `n` queries ending a `context`. On CUDA torch's
    `CausalBias`: no [n, context] tensor is built, the memory-efficient kernel applies it. On
    the CPU SDPA would build that mask itself, so it is given: `torch.nn.attention.bias`
    imports torch._dynamo, ~3 s of every CPU process's start-up, for nothing there."""
    if device.type != "cuda":
        return _causal(n, context, device)
    from torch.nn.attention.bias import causal_lower_right

    return causal_lower_right(n, context)


def _causal(n: int, context: int, device: torch.device) -> torch.Tensor:  # [n, context] bool
    """The lower-right causal mask as a tensor, for attention computed outside SDPA."""
    query_pos = torch.arange(context - n, context, device=device).unsqueeze(1)
    return torch.arange(context, device=device).unsqueeze(0) <= query_pos


# On CUDA, SDPA may pick cuDNN's attention, which plans anew for every shape (hundreds of ms):
# prefill shapes change with every chunk. These backends plan nothing.
_CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _pinned_sdpa(device: torch.device) -> AbstractContextManager[None]:
    if device.type == "cuda":
        return sdpa_kernel(_CUDA_SDPA_BACKENDS)
    return nullcontext()


def softcapped_attention(
    q: torch.Tensor,  # [..., kv_heads, per_kv_head, n, head_dim]
    k: torch.Tensor,  # [..., kv_heads, 1, context, head_dim]
    v: torch.Tensor,
    mask: torch.Tensor | None,  # bool, True = may attend, broadcast to [..., n, context]
    scale: float,
    softcap: float,
) -> torch.Tensor:  # [..., kv_heads, per_kv_head, n, head_dim]
    """Attention with Gemma 2's soft-capped scores, the softmax in float32 as transformers'."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [..., n, context]
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)
