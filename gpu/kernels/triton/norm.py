"""RMSNorm, with the residual add before it, in one pass over each row (Triton).

`rms_norm(x, weight, eps, residual)` rounds exactly where `gpu.models.layers.RMSNorm` and
`residual += x` do in PyTorch: the residual sum to x's dtype, the normalised row (computed in
float32) to x's dtype, then the product with the weight to the output dtype. On CUDA the
casts round to nearest even, as PyTorch's.

`rounding(interpret)` is the cast every kernel of this folder rounds with: Triton's CPU
interpreter truncates float32 to bfloat16 (and rounds ties away from zero when asked to round),
so bfloat16 is rounded here to nearest even on the bits, the same on CUDA as under the
interpreter, and the tests can ask for PyTorch's bits exactly.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HIDDEN = 65536  # the whole row lives in one program's registers

# triton.language and the rounding cast, bound by `_kernel`: module globals because Triton's
# interpreter runs a kernel among its module's globals (a closure variable fails under it).
# One mode per process (CUDA, or the interpreter): building the other rebinds `round_to`.
tl: Any = None
round_to: Any = None


def rms_norm(
    x: torch.Tensor,  # [rows, hidden], elements contiguous
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [rows, hidden] x's dtype: += x first, in place
) -> torch.Tensor:  # [rows, hidden] in x's dtype promoted with the weight's, as torch's
    """RMSNorm of x (of residual + x, with a residual), each row in one program.

    CUDA tensors, or CPU tensors where Triton's interpreter is in force (`triton_kernels()`
    checks that). Reads nothing back to the host: capturable in a CUDA graph."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [rows, hidden] with contiguous rows, not {tuple(x.shape)}")
    rows, hidden = x.shape
    if x.dtype not in DTYPES:
        raise ValueError(f"x is {x.dtype}: expected one of {DTYPES}")
    if tuple(weight.shape) != (hidden,) or not weight.is_contiguous():
        raise ValueError(f"weight {tuple(weight.shape)} is not a contiguous ({hidden},)")
    if hidden > MAX_HIDDEN:
        raise ValueError(f"hidden {hidden} is past {MAX_HIDDEN}, one program's row")
    if residual is not None:
        if residual.shape != x.shape or residual.stride(1) != 1:
            raise ValueError(f"residual {tuple(residual.shape)} is not x's {tuple(x.shape)}")
        if residual.dtype != x.dtype:
            raise ValueError(f"residual is {residual.dtype}, x {x.dtype}: one dtype")
    dtype = torch.promote_types(x.dtype, weight.dtype)  # as `weight * normed` in torch
    out = torch.empty(rows, hidden, dtype=dtype, device=x.device)
    if rows == 0:
        return out
    block = max(16, 1 << (hidden - 1).bit_length())  # the row, padded to a power of two
    _kernel(x.device.type != "cuda")[(rows,)](
        x,
        residual if residual is not None else x,  # unread without a residual
        weight,
        out,
        hidden,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=min(16, max(1, block // 512)),
        enable_fp_fusion=False,  # no FMA: each product rounds as PyTorch's separate ops do
    )
    return out


@functools.cache
def rounding(interpret: bool) -> Any:
    """`round_to(x, dtype)`: float32 x cast to `dtype` rounded to nearest even, as PyTorch's
    casts, wrapped for the interpreter or for CUDA. Binds this module's `tl`."""
    global tl
    import triton  # optional: imported on first use

    tl = triton.language

    def round_to(x, dtype: tl.constexpr):  # type: ignore[no-untyped-def]  # x: float32
        if dtype == tl.bfloat16:
            # Add just under half a bfloat16 ulp, plus the kept lowest bit (ties to even),
            # then drop the 16 low bits; NaN would carry into the sign, so it passes as is.
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        return x.to(dtype)  # exact for bfloat16 now; float16 rounds to nearest even

    return wrap(round_to, interpret)


def wrap(fn: Any, interpret: bool) -> Any:
    # By hand in the mode asked for: `triton.jit` follows TRITON_INTERPRET even where the
    # interpreter cannot run (set after triton's import).
    import triton

    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    return triton.runtime.JITFunction(fn)


@functools.cache
def _kernel(interpret: bool) -> Any:
    global round_to
    round_to = rounding(interpret)

    def rms_norm_rows(  # type: ignore[no-untyped-def]  # Triton types the arguments at launch
        x_ptr,  # [rows, hidden], row stride stride_x
        r_ptr,  # [rows, hidden], row stride stride_r: the residual, updated in place
        w_ptr,  # [hidden]
        o_ptr,  # [rows, hidden] contiguous
        hidden,
        stride_x,
        stride_r,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)  # [BLOCK] x's dtype
        if HAS_RESIDUAL:
            r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0)
            x = round_to(r.to(tl.float32) + x.to(tl.float32), x.dtype)  # `residual += x`
            tl.store(r_ptr + row * stride_r + cols, x, mask=mask)
        x32 = x.to(tl.float32)
        mean_square = tl.sum(x32 * x32, axis=0) / hidden
        normed = round_to(x32 * tl.rsqrt(mean_square + eps), x.dtype)  # rounded, as RMSNorm does
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        y = normed.to(tl.float32) * w.to(tl.float32)
        tl.store(o_ptr + row * hidden + cols, round_to(y, o_ptr.dtype.element_ty), mask=mask)

    return wrap(rms_norm_rows, interpret)
