"""The operations a model's forward is written in: the one interface between models and backends.

A model file (`gpu/models/`) computes its projections, its own norms and its MLP in torch, and
asks the backend's `LayerOps` for what has a faster form elsewhere: RMSNorm with the residual
add before it, SwiGLU's activation, rotary embedding with the K/V write and paged attention.
Each backend (`gpu/backends/`) provides one `LayerOps`: `TorchOps` (PyTorch alone: the
reference and the fallback) or `KernelOps` over a kernel library (tokenmill's native CPU
kernels, Triton's on CUDA). A model names no backend and tests for none: one forward route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from gpu.backends.metadata import AttentionMetadata
from gpu.kv_pool import LayerKV
from gpu.model_config import GEMMA_FAMILY, ModelConfig


@dataclass(frozen=True)
class AttentionShape:
    """One attention layer's constants: heads, rotary width, scale, soft cap, window."""

    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int  # 0: no rotary embedding (GPT-2)
    scale: float
    softcap: float | None = None  # scores = softcap · tanh(scores / softcap) (Gemma 2)
    window: int | None = None  # sliding window: a query at p sees (p - window, p]

    @classmethod
    def of(
        cls, config: ModelConfig, *, window: int | None = None, rotary: bool = True
    ) -> AttentionShape:
        # head_dim ** -0.5 as the Llama and GPT-2 references compute it (1 / sqrt may differ
        # in the last bit); Gemma's from its query_pre_attn_scalar
        scale = config.head_dim**-0.5
        if config.arch in GEMMA_FAMILY:
            scale = config.attention_scale
        return cls(
            heads=config.num_heads,
            kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            rotary_dim=config.rotary_dim if rotary else 0,
            scale=scale,
            softcap=config.attn_logit_softcapping,
            window=window,
        )

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Rope:
    """A step's rotary embedding for one set of tables: the tables and each token's row.

    `cos`/`sin` are the rows gathered per token ([tokens, 1, rotary_dim] in the compute
    dtype) where the backend rotates in torch; None where a kernel reads the tables itself."""

    table_cos: torch.Tensor  # [rows, rotary_dim] float32
    table_sin: torch.Tensor
    rows: torch.Tensor  # [tokens] int64
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None


class LayerOps(Protocol):
    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden]: += x first, in place
    ) -> torch.Tensor:  # [rows, hidden] the norm of x (of residual + x, with a residual)
        """RMSNorm (weight · x̂, normalised in float32); with `residual`, the add before it."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        """SwiGLU's activation: silu(gate) · up, gate and up the halves of each row."""
        ...

    def gelu_tanh_mul(
        self, gate_up: torch.Tensor
    ) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        """GeGLU's activation (Gemma): gelu(gate) · up with GELU's tanh form."""
        ...

    def rope(
        self, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
    ) -> Rope:
        """The step's rotation by tables cos, sin [positions, rotary_dim] at `rows` [tokens],
        made once per step and table and handed to every layer's `attention`."""
        ...

    def attention(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size] rows contiguous; q and k may be
        # rotated in place
        shape: AttentionShape,
        rope: Rope | None,  # None: no rotary embedding
        kv: LayerKV,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [tokens, heads, head_dim]
        """Rotate q and k, write k and v into the pool at the step's slots, attend."""
        ...


def split_heads(
    qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size]
    shape: AttentionShape,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim]: views of `qkv`."""
    q, k, v = torch.split(qkv, [shape.q_size, shape.kv_size, shape.kv_size], dim=-1)
    return (
        q.view(-1, shape.heads, shape.head_dim),
        k.view(-1, shape.kv_heads, shape.head_dim),
        v.view(-1, shape.kv_heads, shape.head_dim),
    )
