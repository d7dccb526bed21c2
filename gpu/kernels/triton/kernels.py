"""`TritonKernels`: the `StepKernels` library of CUDA (`gpu/kernels/step_kernels.py`), made of
this folder's Triton kernels, plus the fused rotary + K/V write (`rope_and_cache_`).

`triton_kernels()` hands out the one instance, or None (one warning) where Triton cannot run:
not importable, or neither CUDA nor Triton's CPU interpreter in force (`TRITON_INTERPRET=1`
set before `triton` was first imported: the tests). Importing this module imports no Triton.

No method reads a tensor back to the host or waits for the device: grids come from shapes
alone, so a step made of them can be captured in a CUDA graph (after a first, compiling call).
"""

from __future__ import annotations

import functools
import logging

import torch

from gpu.kernels.triton.activation import silu_mul
from gpu.kernels.triton.norm import rms_norm
from gpu.kernels.triton.rotary import rope_, rope_and_cache_
from gpu.kernels.triton.runtime import interpreting, triton_module

log = logging.getLogger("tokenmill.kernels")


class TritonKernels:
    """The Triton kernels on CUDA tensors (CPU ones under the interpreter), in float32,
    bfloat16 or float16, accumulating in float32."""

    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden]: += x first, in place
    ) -> torch.Tensor:  # [rows, hidden] the norm of x (of residual + x, with a residual)
        """RMSNorm as `gpu.models.layers.RMSNorm`; with `residual`, the add before it."""
        return rms_norm(x, weight, eps, residual)

    def rope_(
        self,
        x: torch.Tensor,  # [rows, ≥ heads * head_dim], elements contiguous (a fused qkv)
        heads: int,
        head_dim: int,
        positions: torch.Tensor,  # [rows] int64 rows of the rope tables
        cos: torch.Tensor,  # [max_positions, head_dim] float32
        sin: torch.Tensor,
    ) -> None:
        """Rotary embedding (rotate-half) in place on the first `heads` heads of each row."""
        rope_(x, heads, head_dim, positions, cos, sin)

    def rope_and_cache_(
        self,
        qkv: torch.Tensor,  # [rows, ≥ (num_heads + 2 * num_kv_heads) * head_dim]
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        positions: torch.Tensor,  # [rows] int64 rows of the rope tables
        cos: torch.Tensor,  # [max_positions, head_dim] float32
        sin: torch.Tensor,
        k_pool: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_pool: torch.Tensor,
        slot_mapping: torch.Tensor,  # [rows] int64 flat slots; < 0: padding, not written
    ) -> None:
        """Rotary embedding in place on q and k, and k and v written into the pool."""
        pools = (k_pool, v_pool, slot_mapping)
        rope_and_cache_(qkv, num_heads, num_kv_heads, head_dim, positions, cos, sin, *pools)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        """SwiGLU's activation: silu(gate) · up, gate and up the halves of each row."""
        return silu_mul(gate_up)

    def paged_decode_attention(
        self,
        q: torch.Tensor,  # [seqs, heads, head_dim] contiguous
        k: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim] a layer's pool
        v: torch.Tensor,
        tables: torch.Tensor,  # [seqs, width] int64 block tables
        lengths: torch.Tensor,  # [seqs] int64 positions each attends to
        scale: float,
        out: torch.Tensor,  # [seqs, heads, head_dim], written
        *,
        starts: torch.Tensor | None = None,  # [seqs] int64 first position each attends to
        softcap: float | None = None,  # scores become softcap · tanh(score / softcap)
    ) -> None:
        """Each sequence's one query attends to positions `starts .. lengths - 1` of its
        blocks, read where they lie in the pool (`paged_decode.py`)."""
        from gpu.kernels.triton.paged_decode import paged_decode_attention

        paged_decode_attention(q, k, v, tables, lengths, scale, out, starts=starts, softcap=softcap)

    def paged_prefill_attention(
        self,
        q: torch.Tensor,  # [n, heads, head_dim] a chunk at positions context - n .. context - 1
        k: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim] a layer's pool
        v: torch.Tensor,
        table: torch.Tensor,  # [≥ ceil(context / block_size)] the sequence's block table
        context: int,  # positions attended in total (the chunk's start + n)
        scale: float,
        out: torch.Tensor,  # [n, heads, head_dim], written
        *,
        window: int | None = None,  # the query at p sees keys in (p - window, p]
        softcap: float | None = None,  # scores become softcap · tanh(score / softcap)
    ) -> None:
        """Causal attention of one prefill chunk over its sequence's cached context and
        itself, read through the block table (`paged_prefill.py`)."""
        from gpu.kernels.triton.paged_prefill import paged_prefill_attention

        paged_prefill_attention(q, k, v, table, context, scale, out, window=window, softcap=softcap)


@functools.cache
def triton_kernels() -> TritonKernels | None:
    """The Triton kernels, or None (one warning) where Triton cannot run here."""
    try:
        triton_module()
    except ImportError as exc:
        reason = f"triton is not importable: {exc}"
    else:
        if torch.cuda.is_available() or interpreting():
            return TritonKernels()
        reason = "no CUDA device, and Triton's interpreter not in force (TRITON_INTERPRET=1)"
    log.warning(
        "the Triton kernels are off (%s): models run PyTorch's ops, with the same results",
        reason,
    )
    return None
