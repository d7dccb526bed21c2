"""SwiGLU's activation, silu(gate) · up over the halves of each gate_up row (Triton).

Rounding is PyTorch's `F.silu(gate) * up` step for step: silu computed in float32 as
`g / (1 + exp(-g))` and rounded to the dtype, then the product rounded to it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpu.kernels.triton import norm

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BLOCK = 1024  # elements of a row one program covers

# triton.language and the rounding cast, bound by `_kernel`: module globals because Triton's
# interpreter runs a kernel among its module's globals (a closure variable fails under it).
# One mode per process (CUDA, or the interpreter): building the other rebinds `round_to`.
tl: Any = None
round_to: Any = None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
    """silu(gate) · up, gate and up the halves of each row, in gate_up's dtype.

    CUDA tensors, or CPU tensors where Triton's interpreter is in force (`triton_kernels()`
    checks that). Reads nothing back to the host: capturable in a CUDA graph."""
    if gate_up.dim() != 2 or gate_up.stride(1) != 1 or gate_up.shape[1] % 2:
        raise ValueError("gate_up must be [rows, 2 * size], elements contiguous")
    if gate_up.dtype not in DTYPES:
        raise ValueError(f"gate_up is {gate_up.dtype}: expected one of {DTYPES}")
    rows, size = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, size)
    if rows == 0 or size == 0:
        return out
    block = min(MAX_BLOCK, max(16, 1 << (size - 1).bit_length()))
    grid = (rows, (size + block - 1) // block)
    _kernel(gate_up.device.type != "cuda")[grid](
        gate_up,
        out,
        size,
        gate_up.stride(0),
        BLOCK=block,
        num_warps=4,
        enable_fp_fusion=False,  # as PyTorch's separate ops round
    )
    return out


@functools.cache
def _kernel(interpret: bool) -> Any:
    global tl, round_to
    round_to = norm.rounding(interpret)
    tl = norm.tl

    def silu_mul_rows(  # type: ignore[no-untyped-def]  # Triton types the arguments at launch
        gu_ptr,  # [rows, 2 * size], row stride stride_gu: gate | up
        o_ptr,  # [rows, size] contiguous
        size,
        stride_gu,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
        mask = cols < size
        dtype = gu_ptr.dtype.element_ty
        gate = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + size + cols, mask=mask, other=0.0)
        silu = round_to(tl.div_rn(gate, 1.0 + tl.exp(-gate)), dtype)  # F.silu's, rounded
        y = round_to(silu.to(tl.float32) * up.to(tl.float32), dtype)
        tl.store(o_ptr + row * size + cols, y, mask=mask)

    return norm.wrap(silu_mul_rows, interpret)
