"""What the model files ask of a kernel library, whichever device it runs on.

Two libraries implement it: `CpuKernels` (`gpu/kernels/native.py`, C built on the host, float32
CPU tensors) and `TritonKernels` (`gpu/kernels/triton/kernels.py`, CUDA, or the CPU through
Triton's interpreter in tests). The models and the attention code hold a `StepKernels` and never
ask which one it is, except for the few things only one of them has: the CPU's one-call decode
step (`isinstance(kernels, CpuKernels)`), and Triton's fused rotary + K/V write
(`rope_and_cache_`) and prefill attention over the pool (`paged_prefill_attention`), which
the callers look up by name, taking the torch path where a library lacks them.

Every method takes and returns device tensors and never reads one back to the host, so a step
made of them can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import Protocol

import torch


class StepKernels(Protocol):
    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden]: += x first, in place
    ) -> torch.Tensor:  # [rows, hidden] the norm of x (of residual + x, with a residual)
        """RMSNorm as `gpu.models.layers.RMSNorm`; with `residual`, the add before it."""
        ...

    def rope_(
        self,
        x: torch.Tensor,  # [rows, ≥ heads * head_dim], rows contiguous (a fused qkv)
        heads: int,
        head_dim: int,
        positions: torch.Tensor,  # [rows] int64 rows of the rope tables
        cos: torch.Tensor,  # [max_positions, head_dim] float32
        sin: torch.Tensor,
    ) -> None:
        """Rotary embedding (rotate-half) in place on the first `heads` heads of each row."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        """SwiGLU's activation: silu(gate) · up, gate and up the halves of each row."""
        ...

    def paged_decode_attention(
        self,
        q: torch.Tensor,  # [seqs, heads, head_dim] contiguous
        k: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim] a layer's pool
        v: torch.Tensor,
        tables: torch.Tensor,  # [seqs, width] int64 block tables
        lengths: torch.Tensor,  # [seqs] int64 positions each attends to (≤ width × block_size)
        scale: float,
        out: torch.Tensor,  # [seqs, heads, head_dim], written
        *,
        starts: torch.Tensor | None = None,  # [seqs] int64 first position each attends to
        softcap: float | None = None,  # scores become softcap · tanh(score / softcap)
    ) -> None:
        """Each sequence's one query attends to positions `starts .. lengths - 1` of its
        blocks, read where they lie in the pool."""
        ...
