"""`y = x @ w.T (+ bias)` for a `QuantizedWeight` on CUDA: one Triton kernel that reads the
integers and their group scales (and offsets), dequantizes them in registers to x's dtype and
multiplies with `tl.dot`, accumulating in float32. The float matrix never exists in memory.

Triton is imported only when it is first needed, so `gpu.quant` imports on hosts without it.
`TRITON_INTERPRET=1` runs the same kernel on the CPU through Triton's interpreter (the tests).
It must be set before `triton` is first imported: Triton wraps its own library (`tl.zeros`,
`tl.interleave`, ...) for the interpreter at that import, and only the kernel itself is
wrapped here, on first use, in the mode then in force.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpu.kernels.triton.runtime import available as available  # re-exported: callers ask here
from gpu.kernels.triton.runtime import interpreting, triton_module
from gpu.quantized_weight import QuantizedWeight

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_N = 64

# triton.language, bound by `_kernel`: a module global because Triton's interpreter patches
# the `tl` it finds among the kernel's globals (a closure variable fails under it).
tl: Any = None


def triton_qlinear(
    x: torch.Tensor,  # [m, in], float16 | bfloat16 | float32
    weight: QuantizedWeight,  # [out, in]
    bias: torch.Tensor | None = None,  # [out]
) -> torch.Tensor:  # [m, out] in x's dtype
    if x.dim() != 2:
        raise ValueError(f"x must be [m, in], not {tuple(x.shape)}")
    m, inputs = x.shape
    out = weight.out_features
    if inputs != weight.in_features:
        raise ValueError(f"x has {inputs} features, the weight {weight.shape}")
    if x.dtype not in DTYPES:
        raise ValueError(f"x is {x.dtype}: expected one of {DTYPES}")
    if x.device != weight.device or (bias is not None and bias.device != x.device):
        raise ValueError("x, the weight and the bias must be on one device")
    if bias is not None and tuple(bias.shape) != (out,):
        raise ValueError(f"bias {tuple(bias.shape)} for {out} outputs")
    interpret = interpreting()
    if x.device.type != "cuda" and not interpret:
        raise ValueError(
            f"x is on {x.device}: the kernel runs on CUDA, or on the CPU under Triton's "
            "interpreter (TRITON_INTERPRET=1 set before triton is imported)"
        )
    y = torch.empty(m, out, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    block_k, per_tile = _k_tiling(weight.group, inputs)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    # float32 x: TF32 only where PyTorch's own matmuls would use it.
    tf32 = x.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    grid = ((out + BLOCK_N - 1) // BLOCK_N, (m + block_m - 1) // block_m)
    _kernel(interpret)[grid](
        x,
        weight.data,
        weight.scales,
        weight.offsets if weight.offsets is not None else weight.scales,  # unread if None
        bias if bias is not None else weight.scales,  # unread if None
        y,
        m,
        out,
        inputs,
        x.stride(0),
        x.stride(1),
        BITS=weight.bits,
        GROUP=weight.group,
        SCALE_PER_TILE=per_tile,
        HAS_OFFSETS=weight.offsets is not None,
        HAS_BIAS=bias is not None,
        PRECISION="tf32" if tf32 else "ieee",
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=block_k,
        enable_fp_fusion=True,  # Triton's default, said outright (unset, 3.9 warns at compile)
    )
    return y


def _k_tiling(group: int, inputs: int) -> tuple[int, bool]:
    """BLOCK_K and whether one scale per row covers a whole K tile.

    BLOCK_K is the largest of 64, 32, 16 (`tl.dot` needs K >= 16) that divides the group, so a
    tile never straddles groups and its scales are one load per row: groups of 16, 32, 64,
    128, 256. Per-channel scales (group == in) are one group whatever BLOCK_K, so 64 with the
    K tail masked. Any other group (8, 24, ...) gets BLOCK_K 32 and a scale gathered per
    element (`k // group`): correct, a little slower."""
    for block_k in (64, 32, 16):
        if group % block_k == 0:
            return block_k, True
    if group == inputs:
        return 64, True
    return 32, False


@functools.cache
def _kernel(interpret: bool) -> Any:
    global tl
    triton = triton_module()
    tl = triton.language

    def qlinear(  # type: ignore[no-untyped-def]  # Triton types the arguments at launch
        x_ptr,  # [M, K], strided
        q_ptr,  # int8 [N, K] | uint8 [N, K // 2]
        s_ptr,  # float32 [N, K // GROUP]
        o_ptr,  # float32 [N, K // GROUP]
        b_ptr,  # [N]
        y_ptr,  # [M, N], contiguous
        M,
        N,
        K,
        stride_xm,
        stride_xk,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        SCALE_PER_TILE: tl.constexpr,
        HAS_OFFSETS: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # Axis 0 walks the outputs: neighbouring programs share the same x rows.
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_n = offs_n < N
        mask_m = offs_m < M
        # Row offsets in int64: out × in (an LM head) and tokens × out pass 2**31.
        rows_n = offs_n.to(tl.int64)
        rows_m = offs_m.to(tl.int64)
        groups = K // GROUP
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K  # all true but in a per-channel K tail
            x = tl.load(
                x_ptr + rows_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )  # [BLOCK_M, BLOCK_K]
            if BITS == 8:
                q = tl.load(
                    q_ptr + rows_n[:, None] * K + offs_k[None, :],
                    mask=mask_n[:, None] & mask_k[None, :],
                    other=0,
                ).to(tl.float32)  # [BLOCK_N, BLOCK_K]
            else:
                # Byte j holds elements 2j (low nibble) and 2j + 1 (high): interleaving the
                # two halves puts them back in order. K is even, so a byte is all in or out.
                offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
                packed = tl.load(
                    q_ptr + rows_n[:, None] * (K // 2) + offs_b[None, :],
                    mask=mask_n[:, None] & (offs_b < K // 2)[None, :],
                    other=0,
                )  # uint8 [BLOCK_N, BLOCK_K // 2]
                q = tl.interleave(packed & 0x0F, packed >> 4).to(tl.float32)  # [BLOCK_N, BLOCK_K]
            if SCALE_PER_TILE:
                at = offs_n * groups + k0 // GROUP  # [BLOCK_N]: the tile lies in one group
                w = q * tl.load(s_ptr + at, mask=mask_n, other=0.0)[:, None]
                if HAS_OFFSETS:
                    w += tl.load(o_ptr + at, mask=mask_n, other=0.0)[:, None]
            else:
                at2 = offs_n[:, None] * groups + offs_k[None, :] // GROUP  # [BLOCK_N, BLOCK_K]
                mask_w = mask_n[:, None] & mask_k[None, :]
                w = q * tl.load(s_ptr + at2, mask=mask_w, other=0.0)
                if HAS_OFFSETS:
                    w += tl.load(o_ptr + at2, mask=mask_w, other=0.0)
            # Masked x is 0, so an offset past the K tail adds nothing.
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(
            y_ptr + rows_m[:, None] * N + offs_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_n[None, :],
        )

    # Wrapped by hand in the mode asked for: `triton.jit` follows TRITON_INTERPRET even where
    # the interpreter cannot run (set after triton's import).
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(qlinear)
    return triton.runtime.JITFunction(qlinear)
