"""What the paged-attention kernels (`paged_decode.py`, `paged_prefill.py`) share: each reads
one layer's pool (`[num_blocks, block_size, kv_heads, head_dim]`) in place through a block table,
so no K/V is gathered, copied per query head or masked through a tensor; this module checks
their operands, sizes their tiles of positions and builds a kernel in the mode asked for.

Positions come in tiles of `KEYS` (the block size when it is a power of two in 16..128):
the block of each position is read from the table (`table[pos // block_size]`), so any block
size works and a tile of one block reads one table entry. Triton is imported only on first use,
as in `gpu.quant.triton_linear`; `TRITON_INTERPRET=1` set before that import runs the kernels on
the CPU (the tests).
"""

from __future__ import annotations

from typing import Any

import torch

from gpu.kernels.triton.runtime import available as available  # re-exported: callers ask here
from gpu.kernels.triton.runtime import interpreting, triton_module

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_operands(
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


def interpret_for(q: torch.Tensor) -> bool:
    """Whether the interpreter runs the kernels for q's device; raises where nothing can."""
    interpret = interpreting()
    if q.device.type != "cuda" and not interpret:
        raise ValueError(
            f"q is on {q.device}: the kernels run on CUDA, or on the CPU under Triton's "
            "interpreter (TRITON_INTERPRET=1 set before triton is imported)"
        )
    return interpret


def pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def keys_per_tile(block_size: int) -> int:
    """Positions per tile: the block size if a power of two in 16..128 (one table entry per
    tile), else the next power of two, clipped to 16..128 (tl.dot's N is at least 16)."""
    return min(128, max(16, pow2(block_size)))


def wrap(kernel: Any, interpret: bool) -> Any:
    # Wrapped by hand in the mode asked for: `triton.jit` follows TRITON_INTERPRET even where
    # the interpreter cannot run (set after triton's import).
    triton = triton_module()
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(kernel)
    return triton.runtime.JITFunction(kernel)
