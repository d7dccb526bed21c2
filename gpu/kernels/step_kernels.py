"""What the model files ask of a kernel library, whichever device it runs on.

Two libraries implement it: `CpuKernels` (`gpu/kernels/native.py`, C built on the host, float32
CPU tensors) and `TritonKernels` (`gpu/kernels/triton/kernels.py`, CUDA, or the CPU through
Triton's interpreter in tests). The models and the attention code hold a `StepKernels` and never
ask which one it is, except for the few things only one of them has: the CPU's one-call decode
step (`isinstance(kernels, CpuKernels)`) and its attention of all a step's prefill chunks in
one call (`span_attention`, told by `ChunkTables` which chunks read their keys in the pool),
and Triton's fused rotary + K/V write (`rope_and_cache_`) and prefill attention over the pool
(`paged_prefill_attention`), which the callers look up by name, taking the torch path where a
library lacks them.

Every method takes and returns device tensors and never reads one back to the host, so a step
made of them can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class ChunkTables:
    """Which prefill chunks of a step continue a cached context, for `span_attention`: their
    keys are read in the KV pool through their block tables."""

    keys: torch.Tensor  # [chunks] int64: the positions each attends to (its own rows the last)
    offsets: torch.Tensor  # [chunks] int64: where its table starts in `tables`; -1: own rows
    tables: torch.Tensor  # [total] int64: the chunks' block tables, one after another

    def check(self, bounds: torch.Tensor, num_blocks: int, block_size: int) -> None:
        """Refuse what would read outside the pool or the tables (one host read of each)."""
        chunks = bounds.shape[1]
        for t in (self.keys, self.offsets, self.tables):
            if t.dtype != torch.int64 or not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError("chunk tables must be contiguous int64 CPU tensors")
        if self.keys.shape != (chunks,) or self.offsets.shape != (chunks,):
            raise ValueError(f"keys and offsets must be [{chunks}], one per chunk")
        if self.tables.numel() and (
            int(self.tables.min()) < 0 or int(self.tables.max()) >= num_blocks
        ):
            raise ValueError("a block table names a block outside the pool")
        pairs = zip(self.keys.tolist(), self.offsets.tolist(), strict=True)
        for c, (keys, offset) in enumerate(pairs):
            rows = int(bounds[1, c] - bounds[0, c])
            if offset < 0:
                continue
            if keys < rows or offset + -(-keys // block_size) > self.tables.numel():
                raise ValueError(f"chunk {c}: {keys} keys for {rows} rows overrun its table")
