"""`KernelOps`: the layer operations over a kernel library (`gpu/kernels/step_kernels.py`):
tokenmill's native CPU kernels, or Triton's on CUDA.

Norms with their residual add in one pass, rotary embedding in place on the fused qkv rows
(with the K/V write in the same kernel where the library has `rope_and_cache_`), SwiGLU's
activation in one op, and decode attention (prefill too, where the library has
`paged_prefill_attention`) reading the pool where it lies. Same arithmetic as `TorchOps`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpu.backends.layer_ops import AttentionShape, Rope, split_heads
from gpu.backends.metadata import AttentionMetadata
from gpu.backends.sdpa_attention import paged_attention
from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import LayerKV
from gpu.models.layers import apply_rope


class KernelOps:
    def __init__(self, kernels: StepKernels) -> None:
        self.kernels = kernels
        # Triton's: the rotation and the K/V write as one kernel
        self._rope_and_cache = getattr(kernels, "rope_and_cache_", None)

    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden], += x in place
    ) -> torch.Tensor:  # [rows, hidden]
        return self.kernels.rms_norm(x, weight, eps, residual=residual)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        return self.kernels.silu_mul(gate_up)

    def gelu_tanh_mul(
        self, gate_up: torch.Tensor
    ) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        fused = getattr(self.kernels, "gelu_tanh_mul", None)  # the native kernels' (not Triton's)
        if fused is not None and gate_up.dtype == torch.float32:
            out: torch.Tensor = fused(gate_up.contiguous())
            return out
        gate, up = torch.split(gate_up, gate_up.shape[-1] // 2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def rope(
        self, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
    ) -> Rope:
        return Rope(cos, sin, rows)  # the kernels read the tables by row

    def attention(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size] rows contiguous, rotated in place
        shape: AttentionShape,
        rope: Rope | None,
        kv: LayerKV,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [tokens, heads, head_dim]
        written = rope is not None and self._rotate_(qkv, shape, rope, kv, meta)
        q, k, v = split_heads(qkv, shape)
        return paged_attention(
            q,
            k,
            v,
            kv,
            meta.for_window(shape.window),
            shape.scale,
            shape.softcap,
            kernels=self.kernels,
            kv_written=written,
        )

    def _rotate_(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size]
        shape: AttentionShape,
        rope: Rope,
        kv: LayerKV,
        meta: AttentionMetadata,
    ) -> bool:
        """RoPE on q and k in place; returns whether k and v were written into the pool too."""
        s = shape
        if s.rotary_dim == s.head_dim:
            if self._rope_and_cache is not None:
                heads = (s.heads, s.kv_heads, s.head_dim)
                cos, sin = rope.table_cos, rope.table_sin
                self._rope_and_cache(
                    qkv, *heads, rope.rows, cos, sin, kv.k, kv.v, meta.slot_mapping
                )
                return True
            self.kernels.rope_(
                qkv, s.heads + s.kv_heads, s.head_dim, rope.rows, rope.table_cos, rope.table_sin
            )
            return False
        # partial rotary (the kernels' rope_ takes whole heads): in torch, in place
        q, k, _ = split_heads(qkv, s)
        cos, sin = rope.table_cos[rope.rows].unsqueeze(1), rope.table_sin[rope.rows].unsqueeze(1)
        q.copy_(apply_rope(q, cos, sin))
        k.copy_(apply_rope(k, cos, sin))
        return False
