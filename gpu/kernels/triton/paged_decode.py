"""Decode attention over the paged KV pool (Triton): each sequence's one query per head
attends to its blocks, read where they lie in the pool (`paged_attention.py`).

One program per (sequence, KV head, KV split) serves all `heads // kv_heads` query heads
of its KV head (padded to a power of two and masked), walks its split's positions a tile at a
time with an online softmax in float32, and writes (max, sum, acc) partials that a second kernel
reduces; with one split it writes the output itself. The split count and the grid come from the
shapes alone (`_decode_splits`), never from `lengths`, so a call never reads the device back and
can be captured in a CUDA graph. The scores and the weighted sum are elementwise products summed
in float32, not `tl.dot`: a decode query is one row per head, below `tl.dot`'s 16, and the loop
is bound by memory anyway; it also sidesteps the interpreter's bfloat16 dot.
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

# Splits: programs enough to fill a large GPU (about 2 per SM on an H100/H200) before
# splitting pays, at least this many positions per split, and at most this many splits.
FILL_PROGRAMS = 264
MIN_SPLIT_POSITIONS = 256
MAX_SPLITS = 16
# Warps: sm_90 builds (ptxas via Triton 3.9) spill registers with 4 warps from a decode tile of
# 4096 (query heads × positions × head_dim).
DECODE_WIDE_TILE = 4096

# triton.language, bound by `_decode_kernels`: a module global because Triton's interpreter
# patches the `tl` it finds among a kernel's globals.
tl: Any = None


def paged_decode_attention(
    q: torch.Tensor,  # [seqs, heads, head_dim] contiguous, float32 | bfloat16 | float16
    k_pool: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim] one layer's pool
    v_pool: torch.Tensor,
    tables: torch.Tensor,  # [seqs, width] int64 | int32 block tables, padded with block 0
    lengths: torch.Tensor,  # [seqs] int64 | int32 positions attended (0: a padded row)
    scale: float,
    out: torch.Tensor,  # [seqs, heads, head_dim] contiguous, written
    *,
    starts: torch.Tensor | None = None,  # [seqs] first position attended; None: 0
    softcap: float | None = None,  # scores become softcap · tanh(score / softcap)
) -> None:
    """Each sequence's one query (per head) attends to positions `starts .. lengths - 1` of its
    blocks, read where they lie in the pool; a row of length 0 gets zeros. Reads nothing back to
    the host: the grid and the scratch depend only on the shapes."""
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_pool.shape
    check_operands(q, k_pool, v_pool, out, heads, head_dim)
    if tables.dim() != 2 or tables.shape[0] != seqs:
        raise ValueError(f"tables {tuple(tables.shape)} for {seqs} sequences")
    for name, t in (("lengths", lengths), ("starts", starts)):
        if t is not None and tuple(t.shape) != (seqs,):
            raise ValueError(f"{name} {tuple(t.shape)} for {seqs} sequences")
    for t in (tables, lengths, starts):
        if t is not None and (t.dtype not in INDEX_DTYPES or t.device != q.device):
            raise ValueError(f"tables, lengths and starts must be int32/int64 on {q.device}")
    interpret = interpret_for(q)
    if seqs == 0:
        return
    width = tables.shape[1]
    group = heads // kv_heads
    keys = keys_per_tile(block_size)
    splits, tiles_per_split = _decode_splits(seqs, kv_heads, width * block_size, keys)
    tile = pow2(group) * keys * pow2(head_dim)
    # partials: [seqs, heads, splits] max and sum, [seqs, heads, splits, head_dim] weighted V
    # sums, all float32; unused (never read) with one split.
    shape = (seqs, heads, splits) if splits > 1 else (1, 1, 1)
    part_max = torch.empty(shape, dtype=torch.float32, device=q.device)
    part_sum = torch.empty(shape, dtype=torch.float32, device=q.device)
    part_acc = torch.empty((*shape, head_dim), dtype=torch.float32, device=q.device)
    split_kernel, reduce_kernel = _decode_kernels(interpret)
    split_kernel[(seqs, kv_heads, splits)](
        q,
        k_pool,
        v_pool,
        tables,
        lengths,
        starts if starts is not None else lengths,  # unread if None
        out,
        part_max,
        part_sum,
        part_acc,
        float(scale),
        float(softcap or 1.0),
        tables.stride(0),
        tables.stride(1),
        *k_pool.stride()[:3],
        *v_pool.stride()[:3],
        tiles_per_split,
        splits,
        BLOCK_SIZE=block_size,
        KEYS=keys,
        HEADS=heads,
        GROUP=group,
        GROUP_PAD=pow2(group),
        HEAD_DIM=head_dim,
        DIM_PAD=pow2(head_dim),
        HAS_STARTS=starts is not None,
        HAS_SOFTCAP=softcap is not None,
        ONE_SPLIT=splits == 1,
        num_warps=8 if tile >= DECODE_WIDE_TILE else 4,
        enable_fp_fusion=True,  # Triton's default, said outright (unset, 3.9 warns at compile)
    )
    if splits > 1:
        reduce_kernel[(seqs, heads)](
            part_max,
            part_sum,
            part_acc,
            out,
            splits,
            HEAD_DIM=head_dim,
            DIM_PAD=pow2(head_dim),
            SPLITS_PAD=pow2(splits),
            enable_fp_fusion=True,
        )


def _decode_splits(seqs: int, kv_heads: int, positions: int, keys: int) -> tuple[int, int]:
    """(splits, tiles per split) for `seqs` rows of `positions` (table width × block size)
    each: from the shapes only, so the grid is the same whatever the lengths. A batch that
    fills the GPU on its own gets one split; else the splits make up the programs, each of at
    least MIN_SPLIT_POSITIONS positions, at most MAX_SPLITS."""
    tiles = cdiv(positions, keys)
    programs = seqs * kv_heads
    wanted = min(
        MAX_SPLITS,
        cdiv(FILL_PROGRAMS, programs),
        max(1, positions // MIN_SPLIT_POSITIONS),
    )
    tiles_per_split = cdiv(tiles, max(1, wanted))
    return cdiv(tiles, tiles_per_split), tiles_per_split


@functools.cache
def _decode_kernels(interpret: bool) -> tuple[Any, Any]:
    global tl
    triton = triton_module()
    tl = triton.language

    def decode_split(  # type: ignore[no-untyped-def]  # Triton types the arguments at launch
        q_ptr,  # [seqs, HEADS, HEAD_DIM] contiguous
        k_ptr,  # [num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM], strided but in head_dim
        v_ptr,
        table_ptr,  # [seqs, width] int32 | int64
        length_ptr,  # [seqs]
        start_ptr,  # [seqs]
        out_ptr,  # [seqs, HEADS, HEAD_DIM] contiguous
        max_ptr,  # float32 [seqs, HEADS, splits]
        sum_ptr,  # float32 [seqs, HEADS, splits]
        acc_ptr,  # float32 [seqs, HEADS, splits, HEAD_DIM]
        scale,
        softcap,
        stride_ts,
        stride_tw,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_vb,
        stride_vs,
        stride_vh,
        tiles_per_split,
        splits,
        BLOCK_SIZE: tl.constexpr,
        KEYS: tl.constexpr,
        HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr,
        HAS_STARTS: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr,
        ONE_SPLIT: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, DIM_PAD)
        mask_g = offs_g < GROUP
        mask_d = offs_d < HEAD_DIM
        heads = kv_head * GROUP + offs_g  # [GROUP_PAD] the query heads of this KV head
        rows = seq.to(tl.int64) * HEADS + heads  # [GROUP_PAD] rows of q and out
        mask_q = mask_g[:, None] & mask_d[None, :]
        q = tl.load(q_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_q, other=0.0)
        q = q.to(tl.float32) * scale  # [GROUP_PAD, DIM_PAD]
        length = tl.load(length_ptr + seq).to(tl.int32)
        start = 0
        if HAS_STARTS:
            start = tl.load(start_ptr + seq).to(tl.int32)
        # This split's positions, clipped to the row's window [start, length): a split past
        # the length runs no tile and leaves neutral partials.
        first = split * tiles_per_split * KEYS
        lo = tl.maximum(first, start // KEYS * KEYS)
        hi = tl.minimum(first + tiles_per_split * KEYS, length)
        row_max = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros((GROUP_PAD,), dtype=tl.float32)
        acc = tl.zeros((GROUP_PAD, DIM_PAD), dtype=tl.float32)
        table_row = table_ptr + seq.to(tl.int64) * stride_ts
        for tile in range(lo, hi, KEYS):
            pos = tile + tl.arange(0, KEYS)  # [KEYS]
            valid = (pos < length) & (pos >= start)
            block = tl.load(table_row + (pos // BLOCK_SIZE) * stride_tw, mask=valid, other=0)
            slot = pos % BLOCK_SIZE
            k_at = block.to(tl.int64) * stride_kb + slot * stride_ks + kv_head * stride_kh
            v_at = block.to(tl.int64) * stride_vb + slot * stride_vs + kv_head * stride_vh
            mask_kv = valid[:, None] & mask_d[None, :]
            k = tl.load(k_ptr + k_at[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)
            k = k.to(tl.float32)  # [KEYS, DIM_PAD]
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_PAD, KEYS]
            if HAS_SOFTCAP:
                # tanh from exp (triton.language has none); ±1 where exp overflows
                scores = softcap - 2.0 * softcap / (tl.exp(2.0 * scores / softcap) + 1.0)
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))  # [GROUP_PAD]
            # A row with no valid key so far keeps max -inf: subtract 0 there, not -inf.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            weights = tl.exp(scores - shift[:, None])  # [GROUP_PAD, KEYS], 0 where masked
            rescale = tl.exp(row_max - shift)  # [GROUP_PAD]
            v = tl.load(v_ptr + v_at[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)
            v = v.to(tl.float32)  # [KEYS, DIM_PAD]
            row_sum = row_sum * rescale + tl.sum(weights, axis=1)
            acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
            row_max = new_max
        if ONE_SPLIT:
            result = acc / tl.where(row_sum > 0.0, row_sum, 1.0)[:, None]  # zeros if no key
            at = out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :]
            tl.store(at, result.to(out_ptr.dtype.element_ty), mask=mask_q)
        else:
            part = rows * splits + split  # [GROUP_PAD]
            tl.store(max_ptr + part, row_max, mask=mask_g)
            tl.store(sum_ptr + part, row_sum, mask=mask_g)
            tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=mask_q)

    def decode_reduce(  # type: ignore[no-untyped-def]
        max_ptr,  # float32 [seqs, heads, splits]
        sum_ptr,  # float32 [seqs, heads, splits]
        acc_ptr,  # float32 [seqs, heads, splits, HEAD_DIM]
        out_ptr,  # [seqs, heads, HEAD_DIM] contiguous
        splits,
        HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr,
        SPLITS_PAD: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        offs_s = tl.arange(0, SPLITS_PAD)
        offs_d = tl.arange(0, DIM_PAD)
        mask_s = offs_s < splits
        mask_d = offs_d < HEAD_DIM
        part = row * splits + offs_s  # [SPLITS_PAD]
        part_max = tl.load(max_ptr + part, mask=mask_s, other=float("-inf"))
        part_sum = tl.load(sum_ptr + part, mask=mask_s, other=0.0)
        mask_acc = mask_s[:, None] & mask_d[None, :]
        at = acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :]
        part_acc = tl.load(at, mask=mask_acc, other=0.0)  # [SPLITS_PAD, DIM_PAD]
        top = tl.max(part_max, axis=0)
        shift = tl.where(top == float("-inf"), 0.0, top)  # all splits empty: a padded row
        weights = tl.exp(part_max - shift)  # [SPLITS_PAD], 0 for an empty split
        total = tl.sum(weights * part_sum, axis=0)
        result = tl.sum(weights[:, None] * part_acc, axis=0)  # [DIM_PAD]
        result = result / tl.where(total > 0.0, total, 1.0)
        tl.store(
            out_ptr + row * HEAD_DIM + offs_d, result.to(out_ptr.dtype.element_ty), mask=mask_d
        )

    return wrap(decode_split, interpret), wrap(decode_reduce, interpret)
