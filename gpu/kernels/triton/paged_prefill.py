"""Prefill attention over the paged KV pool (Triton): a chunk's queries attend causally to
their sequence's cached context and to themselves, read through the block table
(`paged_attention.py`).

One program per (block of queries, KV head) over a chunk whose K/V are already in the
pool; its rows are (query, query head) pairs, so K/V tiles are loaded once per KV head, and the
products are `tl.dot`s. On CUDA half-precision operands go to the dot as they are (the softmax
weights rounded to that dtype, as FlashAttention does); in float32, or under the interpreter
(whose bfloat16 dot multiplies raw bits), the operands are float32.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpu.kernels.triton.paged_attention import (
    INDEX_DTYPES,
    cdiv,
    check_operands,
    interpret_for,
    keys_per_tile,
    pow2,
    wrap,
)
from gpu.kernels.triton.runtime import triton_module

PREFILL_ROWS = 64  # (query, query head) rows per prefill program
# Warps: sm_90 builds (ptxas via Triton 3.9) spill registers with 4 warps at head_dim 128, or
# float32 at 32.
PREFILL_WARPS = 8

# triton.language, bound by `_prefill_kernel`: a module global because Triton's interpreter
# patches the `tl` it finds among a kernel's globals.
tl: Any = None


def paged_prefill_attention(
    q: torch.Tensor,  # [n, heads, head_dim] contiguous: a chunk at positions context-n .. context-1
    k_pool: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim], the chunk's K/V in it
    v_pool: torch.Tensor,
    table: torch.Tensor,  # [>= ceil(context / block_size)] int64 | int32 the block table
    context: int,  # positions attended in total (start + n)
    scale: float,
    out: torch.Tensor,  # [n, heads, head_dim] contiguous, written
    *,
    window: int | None = None,  # query at p sees keys in (p - window, p]; None: all keys <= p
    softcap: float | None = None,  # scores become softcap · tanh(score / softcap)
) -> None:
    """Causal attention of one prefill chunk over its sequence's cached context and itself,
    through the block table: query i sits at position `context - n + i` and sees the keys at
    positions up to its own (within `window`, if given)."""
    n, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_pool.shape
    check_operands(q, k_pool, v_pool, out, heads, head_dim)
    if table.dim() != 1 or table.dtype not in INDEX_DTYPES or table.device != q.device:
        raise ValueError(f"table must be a 1-D int32/int64 tensor on {q.device}")
    if not n <= context <= table.shape[0] * block_size:
        raise ValueError(f"context {context} for {n} queries and {table.shape[0]} blocks")
    if window is not None and window < 1:
        raise ValueError(f"window {window} must be at least 1")
    interpret = interpret_for(q)
    if n == 0:
        return
    group = heads // kv_heads
    group_pad = pow2(group)
    block_q = max(1, PREFILL_ROWS // group_pad)
    # float32 operands: in float32 (TF32 only where PyTorch's own matmuls would use it), and
    # under the interpreter, whose bfloat16 dot is wrong.
    dot_f32 = interpret or q.dtype == torch.float32
    tf32 = q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not interpret
    _prefill_kernel(interpret)[(cdiv(n, block_q), kv_heads)](
        q,
        k_pool,
        v_pool,
        table,
        out,
        float(scale),
        float(softcap or 1.0),
        n,
        context,
        window or 0,
        table.stride(0),
        *k_pool.stride()[:3],
        *v_pool.stride()[:3],
        BLOCK_SIZE=block_size,
        KEYS=keys_per_tile(block_size),
        HEADS=heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        DIM_PAD=max(16, pow2(head_dim)),  # tl.dot's K is at least 16
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
        DOT_F32=dot_f32,
        PRECISION="tf32" if tf32 else "ieee",
        num_warps=PREFILL_WARPS,
        enable_fp_fusion=True,
    )


@functools.cache
def _prefill_kernel(interpret: bool) -> Any:
    global tl
    triton = triton_module()
    tl = triton.language

    def prefill(  # type: ignore[no-untyped-def]  # Triton types the arguments at launch
        q_ptr,  # [n, HEADS, HEAD_DIM] contiguous
        k_ptr,  # [num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM], strided but in head_dim
        v_ptr,
        table_ptr,  # [>= ceil(context / BLOCK_SIZE)] int32 | int64
        out_ptr,  # [n, HEADS, HEAD_DIM] contiguous
        scale,
        softcap,
        n,
        context,
        window,
        stride_t,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_vb,
        stride_vs,
        stride_vh,
        BLOCK_SIZE: tl.constexpr,
        KEYS: tl.constexpr,
        HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr,
        HAS_WINDOW: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        DOT_F32: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        kv_head = tl.program_id(1)
        first_query = tl.program_id(0) * BLOCK_Q
        # Row r is query first_query + r // GROUP_PAD of query head r % GROUP_PAD (of this KV
        # head's group): each K/V tile serves the whole group.
        offs_r = tl.arange(0, BLOCK_Q * GROUP_PAD)
        query = first_query + offs_r // GROUP_PAD  # [ROWS]
        head = kv_head * GROUP + offs_r % GROUP_PAD  # [ROWS]
        offs_d = tl.arange(0, DIM_PAD)
        mask_d = offs_d < HEAD_DIM
        mask_r = (query < n) & (offs_r % GROUP_PAD < GROUP)
        rows = query.to(tl.int64) * HEADS + head  # [ROWS] rows of q and out
        mask_q = mask_r[:, None] & mask_d[None, :]
        q = tl.load(q_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_q, other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)  # [ROWS, DIM_PAD]
        q_pos = context - n + query  # [ROWS]
        last = tl.minimum(context - n + first_query + BLOCK_Q, context)  # past the last query
        lo = 0
        if HAS_WINDOW:
            lo = tl.maximum(context - n + first_query - window + 1, 0) // KEYS * KEYS
        row_max = tl.full((BLOCK_Q * GROUP_PAD,), float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros((BLOCK_Q * GROUP_PAD,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_Q * GROUP_PAD, DIM_PAD), dtype=tl.float32)
        for tile in range(lo, last, KEYS):
            pos = tile + tl.arange(0, KEYS)  # [KEYS]
            inside = pos < context
            block = tl.load(table_ptr + (pos // BLOCK_SIZE) * stride_t, mask=inside, other=0)
            slot = pos % BLOCK_SIZE
            k_at = block.to(tl.int64) * stride_kb + slot * stride_ks + kv_head * stride_kh
            v_at = block.to(tl.int64) * stride_vb + slot * stride_vs + kv_head * stride_vh
            mask_kv = inside[:, None] & mask_d[None, :]
            k = tl.load(k_ptr + k_at[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)
            v = tl.load(v_ptr + v_at[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)
            if DOT_F32:
                k = k.to(tl.float32)  # [KEYS, DIM_PAD]
                v = v.to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [ROWS, KEYS]
            if HAS_SOFTCAP:
                # tanh from exp (triton.language has none); ±1 where exp overflows
                scores = softcap - 2.0 * softcap / (tl.exp(2.0 * scores / softcap) + 1.0)
            # Lower-right causal: a query sees the keys up to its own position.
            valid = (pos[None, :] <= q_pos[:, None]) & inside[None, :]
            if HAS_WINDOW:
                valid = valid & (pos[None, :] > q_pos[:, None] - window)
            scores = tl.where(valid, scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))  # [ROWS]
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            weights = tl.exp(scores - shift[:, None])  # [ROWS, KEYS], 0 where masked
            rescale = tl.exp(row_max - shift)
            row_sum = row_sum * rescale + tl.sum(weights, axis=1)
            acc = acc * rescale[:, None] + tl.dot(
                weights.to(v.dtype), v, input_precision=PRECISION
            )  # [ROWS, DIM_PAD]
            row_max = new_max
        result = acc / tl.where(row_sum > 0.0, row_sum, 1.0)[:, None]
        at = out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(at, result.to(out_ptr.dtype.element_ty), mask=mask_q)

    return wrap(prefill, interpret)
