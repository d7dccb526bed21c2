"""`TorchOps`: the layer operations in PyTorch alone: the reference every backend matches, and
the fallback wherever no kernel library runs (other dtypes on the CPU, no C compiler)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpu.backends.layer_ops import AttentionShape, Rope, split_heads
from gpu.backends.metadata import AttentionMetadata
from gpu.backends.sdpa_attention import paged_attention
from gpu.kv_pool import LayerKV
from gpu.models.layers import apply_rope, rms_norm


class TorchOps:
    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden], += x in place
    ) -> torch.Tensor:  # [rows, hidden]
        if residual is not None:
            residual += x
            x = residual
        return rms_norm(x, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        gate, up = torch.split(gate_up, gate_up.shape[-1] // 2, dim=-1)
        out: torch.Tensor = F.silu(gate) * up
        return out

    def gelu_tanh_mul(
        self, gate_up: torch.Tensor
    ) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        gate, up = torch.split(gate_up, gate_up.shape[-1] // 2, dim=-1)
        out: torch.Tensor = F.gelu(gate, approximate="tanh") * up
        return out

    def rope(
        self, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
    ) -> Rope:
        gathered_cos = cos[rows].unsqueeze(1).to(dtype)  # [tokens, 1, rotary_dim]
        gathered_sin = sin[rows].unsqueeze(1).to(dtype)
        return Rope(cos, sin, rows, gathered_cos, gathered_sin)

    def attention(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size]
        shape: AttentionShape,
        rope: Rope | None,
        kv: LayerKV,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [tokens, heads, head_dim]
        q, k, v = split_heads(qkv, shape)
        if rope is not None:
            assert rope.cos is not None and rope.sin is not None
            q, k = apply_rope(q, rope.cos, rope.sin), apply_rope(k, rope.cos, rope.sin)
        window_meta = meta.for_window(shape.window)
        return paged_attention(q, k, v, kv, window_meta, shape.scale, shape.softcap)
