"""Attention over the paged KV pool, for a step that mixes decodes and prefill chunks.

The runner builds one `AttentionMetadata` per step (all index tensors, on the device); every
layer reuses it. Tokens of the step are laid out flat: the decode tokens first (one per
sequence), then each prefill chunk's tokens in order.

On float32 CPU models, decodes attend with tokenmill's native kernel (`gpu/kernels`), which
reads each sequence's blocks where they lie in the pool: no copy, one call for all decodes.
Otherwise (GPUs, other dtypes, no C compiler) and for prefill chunks that continue a context,
a sequence's context is read block by block into the pool's gather workspace (`index_select`
into preallocated memory), then attended with SDPA. Decodes then share one SDPA call per group
of similar context lengths; their query heads are grouped by KV head, so grouped-query
attention needs no copy of K/V per query head.

Sliding-window layers (a query at p sees positions (p - window, p]) attend through
`meta.local`, the same step seen through the window: decode groups whose `starts` tell the
native kernel where to begin, gathers of only the window's blocks, windowed masks. Blocks
older than the window are never read. Soft-capped scores (Gemma 2) cannot go through SDPA:
those models attend over the same gathered blocks with the scores computed in torch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right

from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import LayerKV
from gpu.step_clock import StepClock


@dataclass(frozen=True)
class PrefillSpan:
    """One prefill chunk: rows `begin:end` of the step, at positions `start .. start + n - 1`."""

    begin: int
    end: int
    context: int  # start + n: how many positions the chunk attends to
    blocks: torch.Tensor | None  # [ceil(context / block_size)] the block table's head; None
    # when the chunk is the whole context (start == 0): it attends to its own K/V directly.
    mask: torch.Tensor | None  # [n, context] bool, True = may attend; None = causal, from
    # the lower right: query i, at position context - n + i, sees keys 0 .. context - n + i


@dataclass(frozen=True)
class DecodeGroup:
    """Decodes, rows `begin:end`, attended in one call.

    Each sequence's block table is padded to the group's widest (with block 0). The native
    kernel reads each table up to its length, so all decodes form one group; SDPA attends
    the gathered padding too (masked out), so for it decodes are grouped by similar length,
    keeping that padding, copied and attended for nothing, small.
    """

    begin: int
    end: int
    blocks: torch.Tensor  # [sequences * width] block tables, padded with block 0
    lengths: torch.Tensor  # [sequences] int64 positions each sequence attends to
    mask: torch.Tensor | None  # [sequences, 1, 1, width * block_size] bool, False past each
    # length; None where the native kernel attends (it needs none)
    starts: torch.Tensor | None = None  # [sequences] int64 first position attended (a window)


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] flat slot receiving each new token's K/V
    decodes: tuple[DecodeGroup, ...]
    prefills: tuple[PrefillSpan, ...]
    timing: StepClock | None = None  # a benchmark's: adds each layer's attention time
    kernels: StepKernels | None = None  # decode attention that reads the pool in place
    rope_rows: torch.Tensor | None = None  # [tokens] int64 rows of the rope tables, where
    # they are not the positions (LongRoPE: `gpu.models.layers.long_rope_rows`)
    window: int | None = None  # the sliding window these groups and spans see; None: all
    local: AttentionMetadata | None = None  # the step through the sliding window, if any

    def for_window(self, window: int | None) -> AttentionMetadata:
        """The view a layer with this sliding window (None: full attention) attends through."""
        if window is None:
            return self
        if self.local is None or self.local.window != window:
            raise ValueError(f"this step was not prepared for a sliding window of {window}")
        return self.local


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
    kv_written: bool = False,  # k and v are already in the pool (a fused rotary + write)
) -> torch.Tensor:  # [tokens, heads, head_dim]
    began = meta.timing.now() if meta.timing is not None else 0.0
    if not kv_written:
        kv.k.view(-1, *k.shape[1:]).index_copy_(0, meta.slot_mapping, k)
        kv.v.view(-1, *v.shape[1:]).index_copy_(0, meta.slot_mapping, v)
    out = q.new_empty(q.shape)  # contiguous, whatever q's strides
    with _pinned_sdpa(q.device):
        _decode_groups(q, kv, meta, scale, softcap, out)
        _prefill_spans(q, k, v, kv, meta, scale, softcap, out)
    if meta.timing is not None:
        meta.timing.lap("attention", began)
    return out


def _decode_groups(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    kv: LayerKV,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None,
    out: torch.Tensor,  # [tokens, heads, head_dim], the decodes' rows written
) -> None:
    kv_heads, head_dim = kv.k.shape[2:]
    per_kv_head = q.shape[1] // kv_heads
    for group in meta.decodes:
        d = group.end - group.begin
        if group.mask is None:
            assert meta.kernels is not None, "a decode group without a mask needs the kernel"
            meta.kernels.paged_decode_attention(
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
    out: torch.Tensor,  # [tokens, heads, head_dim], the prefills' rows written
) -> None:
    kv_heads, head_dim = kv.k.shape[2:]
    per_kv_head = q.shape[1] // kv_heads
    prefill_kernel = getattr(meta.kernels, "paged_prefill_attention", None)
    for span in meta.prefills:
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
            bias = causal_lower_right(n, span.context)  # no [n, context] tensor is built
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
