"""Attention over the paged KV pool, read in place: Triton kernels that follow each sequence's
block table into one layer's pool (`[num_blocks, block_size, kv_heads, head_dim]`), so no K/V is
gathered, copied per query head or masked through a tensor.

Decode: one program per (sequence, KV head, KV split) serves all `heads // kv_heads` query heads
of its KV head (padded to a power of two and masked), walks its split's positions a tile at a
time with an online softmax in float32, and writes (max, sum, acc) partials that a second kernel
reduces; with one split it writes the output itself. The split count and the grid come from the
shapes alone (`_decode_splits`), never from `lengths`, so a call never reads the device back and
can be captured in a CUDA graph. The scores and the weighted sum are elementwise products summed
in float32, not `tl.dot`: a decode query is one row per head, below `tl.dot`'s 16, and the loop
is bound by memory anyway; it also sidesteps the interpreter's bfloat16 dot.

Prefill: one program per (block of queries, KV head) over a chunk whose K/V are already in the
pool; its rows are (query, query head) pairs, so K/V tiles are loaded once per KV head, and the
products are `tl.dot`s. On CUDA half-precision operands go to the dot as they are (the softmax
weights rounded to that dtype, as FlashAttention does); in float32, or under the interpreter
(whose bfloat16 dot multiplies raw bits), the operands are float32.

Positions come in tiles of `KEYS` (the block size when it is a power of two in 16..128):
the block of each position is read from the table (`table[pos // block_size]`), so any block
size works and a tile of one block reads one table entry. Triton is imported only on first use,
as in `gpu.quant.triton_linear`; `TRITON_INTERPRET=1` set before that import runs the kernels on
the CPU (the tests).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpu.kernels.triton.runtime import available as available  # re-exported: callers ask here
from gpu.kernels.triton.runtime import interpreting, triton_module

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
# Decode splits: programs enough to fill a large GPU (about 2 per SM on an H100/H200) before
# splitting pays, at least this many positions per split, and at most this many splits.
FILL_PROGRAMS = 264
MIN_SPLIT_POSITIONS = 256
MAX_SPLITS = 16
PREFILL_ROWS = 64  # (query, query head) rows per prefill program
# Warps: sm_90 builds (ptxas via Triton 3.9) spill registers with 4 warps from a decode tile of
# 4096 (query heads × positions × head_dim) and in prefill at head_dim 128, or float32 at 32.
DECODE_WIDE_TILE = 4096
PREFILL_WARPS = 8

# triton.language, bound by `_decode_kernels` / `_prefill_kernel`: a module global because
# Triton's interpreter patches the `tl` it finds among a kernel's globals.
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
    _check(q, k_pool, v_pool, out, heads, head_dim)
    if tables.dim() != 2 or tables.shape[0] != seqs:
        raise ValueError(f"tables {tuple(tables.shape)} for {seqs} sequences")
    for name, t in (("lengths", lengths), ("starts", starts)):
        if t is not None and tuple(t.shape) != (seqs,):
            raise ValueError(f"{name} {tuple(t.shape)} for {seqs} sequences")
    for t in (tables, lengths, starts):
        if t is not None and (t.dtype not in INDEX_DTYPES or t.device != q.device):
            raise ValueError(f"tables, lengths and starts must be int32/int64 on {q.device}")
    interpret = _interpret_for(q)
    if seqs == 0:
        return
    width = tables.shape[1]
    group = heads // kv_heads
    keys = _keys_per_tile(block_size)
    splits, tiles_per_split = _decode_splits(seqs, kv_heads, width * block_size, keys)
    tile = _pow2(group) * keys * _pow2(head_dim)
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
        GROUP_PAD=_pow2(group),
        HEAD_DIM=head_dim,
        DIM_PAD=_pow2(head_dim),
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
            DIM_PAD=_pow2(head_dim),
            SPLITS_PAD=_pow2(splits),
            enable_fp_fusion=True,
        )


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
    _check(q, k_pool, v_pool, out, heads, head_dim)
    if table.dim() != 1 or table.dtype not in INDEX_DTYPES or table.device != q.device:
        raise ValueError(f"table must be a 1-D int32/int64 tensor on {q.device}")
    if not n <= context <= table.shape[0] * block_size:
        raise ValueError(f"context {context} for {n} queries and {table.shape[0]} blocks")
    if window is not None and window < 1:
        raise ValueError(f"window {window} must be at least 1")
    interpret = _interpret_for(q)
    if n == 0:
        return
    group = heads // kv_heads
    group_pad = _pow2(group)
    block_q = max(1, PREFILL_ROWS // group_pad)
    # float32 operands: in float32 (TF32 only where PyTorch's own matmuls would use it), and
    # under the interpreter, whose bfloat16 dot is wrong.
    dot_f32 = interpret or q.dtype == torch.float32
    tf32 = q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not interpret
    _prefill_kernel(interpret)[(_cdiv(n, block_q), kv_heads)](
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
        KEYS=_keys_per_tile(block_size),
        HEADS=heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        DIM_PAD=max(16, _pow2(head_dim)),  # tl.dot's K is at least 16
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
        DOT_F32=dot_f32,
        PRECISION="tf32" if tf32 else "ieee",
        num_warps=PREFILL_WARPS,
        enable_fp_fusion=True,
    )


def _check(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    out: torch.Tensor,
    heads: int,
    head_dim: int,
) -> None:
    """Validates what both entry points share."""
    if k_pool.dim() != 4 or v_pool.shape != k_pool.shape:
        raise ValueError(f"pools {tuple(k_pool.shape)}, {tuple(v_pool.shape)}: want 4-D alike")
    kv_heads, pool_dim = k_pool.shape[2], k_pool.shape[3]
    if q.dim() != 3 or pool_dim != head_dim or heads % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit pools {tuple(k_pool.shape)}")
    if out.shape != q.shape or not (q.is_contiguous() and out.is_contiguous()):
        raise ValueError("q and out must be contiguous and of one shape")
    if k_pool.stride(3) != 1 or v_pool.stride(3) != 1:
        raise ValueError("the pools' head_dim must be contiguous")
    if q.dtype not in DTYPES or {k_pool.dtype, v_pool.dtype, out.dtype} != {q.dtype}:
        raise ValueError(f"q, the pools and out must share one of {DTYPES}")
    if {k_pool.device, v_pool.device, out.device} != {q.device}:
        raise ValueError("q, the pools and out must be on one device")


def _interpret_for(q: torch.Tensor) -> bool:
    """Whether the interpreter runs the kernels for q's device; raises where nothing can."""
    interpret = interpreting()
    if q.device.type != "cuda" and not interpret:
        raise ValueError(
            f"q is on {q.device}: the kernels run on CUDA, or on the CPU under Triton's "
            "interpreter (TRITON_INTERPRET=1 set before triton is imported)"
        )
    return interpret


def _pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _keys_per_tile(block_size: int) -> int:
    """Positions per tile: the block size if a power of two in 16..128 (one table entry per
    tile), else the next power of two, clipped to 16..128 (tl.dot's N is at least 16)."""
    return min(128, max(16, _pow2(block_size)))


def _decode_splits(seqs: int, kv_heads: int, positions: int, keys: int) -> tuple[int, int]:
    """(splits, tiles per split) for `seqs` rows of `positions` (table width × block size)
    each: from the shapes only, so the grid is the same whatever the lengths. A batch that
    fills the GPU on its own gets one split; else the splits make up the programs, each of at
    least MIN_SPLIT_POSITIONS positions, at most MAX_SPLITS."""
    tiles = _cdiv(positions, keys)
    programs = seqs * kv_heads
    wanted = min(
        MAX_SPLITS,
        _cdiv(FILL_PROGRAMS, programs),
        max(1, positions // MIN_SPLIT_POSITIONS),
    )
    tiles_per_split = _cdiv(tiles, max(1, wanted))
    return _cdiv(tiles, tiles_per_split), tiles_per_split


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

    return _wrap(decode_split, interpret), _wrap(decode_reduce, interpret)


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

    return _wrap(prefill, interpret)


def _wrap(kernel: Any, interpret: bool) -> Any:
    # Wrapped by hand in the mode asked for: `triton.jit` follows TRITON_INTERPRET even where
    # the interpreter cannot run (set after triton's import).
    triton = triton_module()
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(kernel)
    return triton.runtime.JITFunction(kernel)
