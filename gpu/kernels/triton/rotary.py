"""Rotary embedding (rotate-half) in place on fused qkv rows, and the same with the K/V write
into the paged pool, in one pass (Triton).

Rounding is PyTorch's unfused path step for step, `apply_rope(x, cos.to(dtype), sin.to(dtype))`:
cos and sin rounded to x's dtype, each of `x·cos` and `rotated·sin` rounded to it, then their
sum (FMA off, so nothing is fused past a rounding). In float32 that is the same arithmetic
bit for bit; in bfloat16 and float16 too, on CUDA and under the interpreter alike.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpu.kernels.triton import norm

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TILE = 1024  # elements of a program's tile of half heads: [heads_per_program, head_dim / 2]

# triton.language and the rounding cast, bound by `_kernel`: module globals because Triton's
# interpreter runs a kernel among its module's globals (a closure variable fails under it).
# One mode per process (CUDA, or the interpreter): building the other rebinds `round_to`.
tl: Any = None
round_to: Any = None


def rope_(
    x: torch.Tensor,  # [rows, ≥ heads * head_dim], elements contiguous (a fused qkv)
    heads: int,
    head_dim: int,
    positions: torch.Tensor,  # [rows] int64 rows of the rope tables
    cos: torch.Tensor,  # [max_positions, head_dim] float32
    sin: torch.Tensor,
) -> None:
    """Rotary embedding in place on the first `heads` heads of each row.

    CUDA tensors, or CPU tensors where Triton's interpreter is in force (`triton_kernels()`
    checks that). Reads nothing back to the host: capturable in a CUDA graph."""
    _check_rows(x, heads, head_dim, positions, cos, sin)
    _launch(x, heads, heads, 0, head_dim, positions, cos, sin, None)


def rope_and_cache_(
    qkv: torch.Tensor,  # [rows, ≥ (num_heads + 2 * num_kv_heads) * head_dim], q | k | v
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    positions: torch.Tensor,  # [rows] int64 rows of the rope tables
    cos: torch.Tensor,  # [max_positions, head_dim] float32
    sin: torch.Tensor,
    k_pool: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] a layer's pool
    v_pool: torch.Tensor,
    slot_mapping: torch.Tensor,  # [rows] int64 block * block_size + offset; < 0: not written
) -> None:
    """Rotary embedding in place on each row's q and k heads, and the rotated k and the v of
    each row written into the pool at its slot (rows whose slot is negative, padding, are
    rotated but not written). As `rope_` then `k_pool.view(-1, ...)[slots] = k` (and v)."""
    total = num_heads + 2 * num_kv_heads
    _check_rows(qkv, total, head_dim, positions, cos, sin)
    pool_shape = (num_kv_heads, head_dim)
    for pool in (k_pool, v_pool):
        if pool.dim() != 4 or tuple(pool.shape[2:]) != pool_shape or pool.stride(3) != 1:
            shape = tuple(pool.shape)
            raise ValueError(f"a pool {shape} is not [blocks, block_size, *{pool_shape}]")
        if pool.device != qkv.device:
            raise ValueError(f"a pool is on {pool.device}, qkv on {qkv.device}")
    if k_pool.shape != v_pool.shape or k_pool.stride() != v_pool.stride():
        raise ValueError(f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} differ")
    if slot_mapping.dtype != torch.int64 or tuple(slot_mapping.shape) != (qkv.shape[0],):
        raise ValueError(f"slot_mapping must be int64 [{qkv.shape[0]}]")
    if not slot_mapping.is_contiguous() or slot_mapping.device != qkv.device:
        raise ValueError("slot_mapping must be contiguous, on qkv's device")
    pools = (k_pool, v_pool, slot_mapping)
    _launch(qkv, total, num_heads + num_kv_heads, num_heads, head_dim, positions, cos, sin, pools)


def _check_rows(
    x: torch.Tensor,
    heads: int,
    head_dim: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    if x.dim() != 2 or x.stride(1) != 1 or x.dtype not in DTYPES:
        raise ValueError(f"x must be [rows, width] of {DTYPES}, elements contiguous")
    if head_dim % 2 or x.shape[1] < heads * head_dim:
        raise ValueError(f"{heads} heads of {head_dim} do not fit rows of {x.shape[1]}")
    for table in (cos, sin):
        if table.dtype != torch.float32 or table.dim() != 2 or table.shape[1] != head_dim:
            raise ValueError(f"cos and sin must be float32 [positions, {head_dim}]")
        if not table.is_contiguous() or table.device != x.device:
            raise ValueError("cos and sin must be contiguous, on x's device")
    if positions.dtype != torch.int64 or tuple(positions.shape) != (x.shape[0],):
        raise ValueError(f"positions must be int64 [{x.shape[0]}]")
    if not positions.is_contiguous() or positions.device != x.device:
        raise ValueError("positions must be contiguous, on x's device")


def _launch(
    x: torch.Tensor,  # [rows, width]
    total: int,  # heads the program grid covers: q (and k and v)
    rotated: int,  # the first `rotated` of them turn
    num_heads: int,  # q heads before the k heads (with pools)
    head_dim: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pools: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,  # k, v, slot_mapping
) -> None:
    rows = x.shape[0]
    if rows == 0 or total == 0:
        return
    half = head_dim // 2
    block_half = 1 << (half - 1).bit_length()
    block_heads = min(1 << (total - 1).bit_length(), max(1, TILE // block_half))
    k_pool, v_pool, slots = pools if pools is not None else (x, x, positions)  # unread if None
    block_stride, slot_stride, head_stride = k_pool.stride()[:3] if pools else (0, 0, 0)
    block_size = k_pool.shape[1] if pools else 1
    grid = (rows, (total + block_heads - 1) // block_heads)
    _kernel(x.device.type != "cuda")[grid](
        x,
        positions,
        cos,
        sin,
        k_pool,
        v_pool,
        slots,
        x.stride(0),
        block_stride,
        slot_stride,
        head_stride,
        block_size,
        TOTAL=total,
        ROTATED=rotated,
        Q_HEADS=num_heads,
        HEAD_DIM=head_dim,
        CACHE=pools is not None,
        BLOCK_HEADS=block_heads,
        BLOCK_HALF=block_half,
        num_warps=4,
        enable_fp_fusion=False,  # no FMA: x·cos and rotated·sin round apart, as in PyTorch
    )


@functools.cache
def _kernel(interpret: bool) -> Any:
    global tl, round_to
    round_to = norm.rounding(interpret)
    tl = norm.tl

    def rope_rows(  # type: ignore[no-untyped-def]  # Triton types the arguments at launch
        x_ptr,  # [rows, width], row stride stride_x: heads of HEAD_DIM side by side
        pos_ptr,  # [rows] int64
        cos_ptr,  # [max_positions, HEAD_DIM] float32
        sin_ptr,
        k_ptr,  # [blocks, block_size, kv_heads, HEAD_DIM] strided (CACHE)
        v_ptr,
        slot_ptr,  # [rows] int64 (CACHE)
        stride_x,
        stride_block,
        stride_slot,
        stride_head,
        block_size,
        TOTAL: tl.constexpr,
        ROTATED: tl.constexpr,
        Q_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        CACHE: tl.constexpr,
        BLOCK_HEADS: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
    ):
        # Each thread loads, turns and stores the same (head, j) pair of halves, so turning in
        # place races with no other thread.
        HALF: tl.constexpr = HEAD_DIM // 2
        row = tl.program_id(0).to(tl.int64)
        heads = tl.program_id(1) * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)  # [BLOCK_HEADS]
        j = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
        mask_j = j < HALF
        mask = (heads < TOTAL)[:, None] & mask_j[None, :]  # [BLOCK_HEADS, BLOCK_HALF]
        dtype = x_ptr.dtype.element_ty

        table = tl.load(pos_ptr + row) * HEAD_DIM  # int64: the row's offset in cos and sin
        cos1 = round_to(tl.load(cos_ptr + table + j, mask=mask_j, other=0.0), dtype)
        cos2 = round_to(tl.load(cos_ptr + table + HALF + j, mask=mask_j, other=0.0), dtype)
        sin1 = round_to(tl.load(sin_ptr + table + j, mask=mask_j, other=0.0), dtype)
        sin2 = round_to(tl.load(sin_ptr + table + HALF + j, mask=mask_j, other=0.0), dtype)

        first = x_ptr + row * stride_x + heads[:, None] * HEAD_DIM + j[None, :]
        x1 = tl.load(first, mask=mask, other=0.0)  # [BLOCK_HEADS, BLOCK_HALF] first halves
        x2 = tl.load(first + HALF, mask=mask, other=0.0)  # second halves
        a1 = x1.to(tl.float32)
        a2 = x2.to(tl.float32)
        # x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1); each product rounded first.
        o1 = round_to(
            round_to(a1 * cos1.to(tl.float32)[None, :], dtype).to(tl.float32)
            - round_to(a2 * sin1.to(tl.float32)[None, :], dtype).to(tl.float32),
            dtype,
        )
        o2 = round_to(
            round_to(a2 * cos2.to(tl.float32)[None, :], dtype).to(tl.float32)
            + round_to(a1 * sin2.to(tl.float32)[None, :], dtype).to(tl.float32),
            dtype,
        )
        turned = (heads < ROTATED)[:, None]  # q and k heads; v heads pass as they are
        tl.store(first, o1, mask=mask & turned)
        tl.store(first + HALF, o2, mask=mask & turned)

        if CACHE:
            # The row's slot in every lane ([BLOCK_HALF]): the interpreter takes no scalar
            # in a store's mask. < 0: padding, not written.
            slot = tl.load(slot_ptr + row + j * 0)
            at = tl.maximum(slot, 0)
            place = (at // block_size) * stride_block + (at % block_size) * stride_slot
            is_k = (heads >= Q_HEADS) & (heads < ROTATED)  # [BLOCK_HEADS]
            is_v = (heads >= ROTATED) & (heads < TOTAL)
            kv_head = tl.where(is_k, heads - Q_HEADS, heads - ROTATED)
            into = kv_head[:, None] * stride_head + (place + j)[None, :]  # [heads, half]
            write = mask & (slot >= 0)[None, :]
            k_out = k_ptr.dtype.element_ty  # the pool's dtype: x's, or narrower
            v_out = v_ptr.dtype.element_ty
            k1, k2 = round_to(o1.to(tl.float32), k_out), round_to(o2.to(tl.float32), k_out)
            v1, v2 = round_to(a1, v_out), round_to(a2, v_out)
            tl.store(k_ptr + into, k1, mask=write & is_k[:, None])
            tl.store(k_ptr + into + HALF, k2, mask=write & is_k[:, None])
            tl.store(v_ptr + into, v1, mask=write & is_v[:, None])
            tl.store(v_ptr + into + HALF, v2, mask=write & is_v[:, None])

    return norm.wrap(rope_rows, interpret)
