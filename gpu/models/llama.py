"""The Llama family: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Llama, Mistral, Qwen2; Qwen3 (RMSNorm on each q and k head before RoPE); Phi-3/Phi-4 (q/k/v
and gate/up stored fused, LongRoPE, partial rotary); Mixtral and Qwen3-MoE (a sparse mixture
of SwiGLU experts for the MLP: `gpu/models/moe.py`).

Tokens of a step arrive flat (`[tokens]`, no padding); attention reads and writes the paged KV
pool. q/k/v and gate/up are fused into one matmul each when the weights are loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpu.kernels.native import CpuKernels
from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import KVPool, LayerKV
from gpu.model_config import ModelConfig
from gpu.models.attention import AttentionMetadata, paged_attention
from gpu.models.layers import (
    RMSNorm,
    WeightSource,
    apply_rope,
    copy_into,
    fill_embedding,
    fill_linear,
    load_attention,
    load_gated_mlp,
    rope_tables,
)
from gpu.models.llama_decode_step import DecodeStep, implements, small_decode_step
from gpu.models.moe import EXPERT_NAMES, SparseMoE


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv_proj = nn.Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.output_bias)
        self.scale = config.head_dim**-0.5
        if config.qk_norm:  # Qwen3: over each head's head_dim
            self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        cos: torch.Tensor,  # [tokens, 1, head_dim]
        sin: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        c = self.config
        qkv = self.qkv_proj(x)  # [tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(-1, c.num_heads, c.head_dim)  # [tokens, heads, head_dim]
        k = k.view(-1, c.num_kv_heads, c.head_dim)  # [tokens, kv_heads, head_dim]
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, kv, meta)

    def rotate_(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size] rows contiguous, changed in place
        rope_rows: torch.Tensor,  # [tokens] int64 rows of the rope tables
        cos: torch.Tensor,  # [rows, rotary_dim] float32
        sin: torch.Tensor,
        kernels: StepKernels,
        kv: LayerKV | None = None,
        meta: AttentionMetadata | None = None,
    ) -> bool:
        """q/k norms (in torch) and RoPE (the kernel's, over whole heads) on the fused qkv
        rows. With `kv` and `meta`, a library that can (`rope_and_cache_`) also writes k and v
        into the pool at the step's slots: returns whether it did."""
        c = self.config
        tokens = qkv.shape[0]
        q = qkv[:, : c.q_size].view(tokens, c.num_heads, c.head_dim)
        k = qkv[:, c.q_size : c.q_size + c.kv_size].view(tokens, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q.copy_(self.q_norm(q))
            k.copy_(self.k_norm(k))
        if c.rotary_dim == c.head_dim:
            rope_and_cache_ = getattr(kernels, "rope_and_cache_", None)
            if rope_and_cache_ is not None and kv is not None and meta is not None:
                heads = (c.num_heads, c.num_kv_heads, c.head_dim)
                rope_and_cache_(qkv, *heads, rope_rows, cos, sin, kv.k, kv.v, meta.slot_mapping)
                return True
            kernels.rope_(qkv, c.num_heads + c.num_kv_heads, c.head_dim, rope_rows, cos, sin)
            return False
        cos_t, sin_t = cos[rope_rows].unsqueeze(1), sin[rope_rows].unsqueeze(1)
        q.copy_(apply_rope(q, cos_t, sin_t))  # partial rotary: the kernels' rope_ takes whole heads
        k.copy_(apply_rope(k, cos_t, sin_t))
        return False

    def attend(
        self,
        q: torch.Tensor,  # [tokens, q_size] or [tokens, heads, head_dim], rotated
        k: torch.Tensor,  # [tokens, kv_size] or [tokens, kv_heads, head_dim], rotated
        v: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        *,
        kv_written: bool = False,  # k and v are in the pool already (`rotate_` wrote them)
    ) -> torch.Tensor:  # [tokens, hidden]
        c = self.config
        q = q.view(-1, c.num_heads, c.head_dim)
        k = k.view(-1, c.num_kv_heads, c.head_dim)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        out = paged_attention(q, k, v, kv, meta, self.scale, kv_written=kv_written)
        hidden: torch.Tensor = self.o_proj(out.flatten(1))  # [tokens, hidden]
        return hidden


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [tokens, hidden]
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


class LlamaLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = SparseMoE(config) if config.sparse_layer(index) else LlamaMLP(config)


class LlamaForCausalLM(nn.Module):
    rope_cos: torch.Tensor  # [positions, head_dim] float32
    rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaLayer(config, n) for n in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.decode_step: DecodeStep | None = None  # the small native decode step, built on use
        cos, sin = rope_tables(config, max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)  # [positions, head_dim]
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,  # [tokens]
        positions: torch.Tensor,  # [tokens]
        kv: KVPool,
        meta: AttentionMetadata,
        logits_rows: torch.Tensor,  # [rows] which tokens' next-token logits are needed
    ) -> torch.Tensor:  # [rows, vocab] float32
        x = self.embed_tokens(input_ids)  # [tokens, hidden]
        rope_rows = positions if meta.rope_rows is None else meta.rope_rows  # [tokens]
        kernels = meta.kernels
        native = isinstance(kernels, CpuKernels)
        if kernels is not None and (x.dtype == torch.float32 or not native):
            if native and implements(self.config):
                assert isinstance(kernels, CpuKernels)
                if self.decode_step is None or self.decode_step.kernels is not kernels:
                    self.decode_step = DecodeStep(self, kernels)
                if small_decode_step(meta, x.shape[0], self.decode_step.max_rows):
                    every = self.decode_step(x, rope_rows, kv, meta)  # [tokens, vocab]
                    # every decode samples, and the runner lists the rows in order: no copy
                    # of the logits (12 MB at 64 rows) when they are all of them
                    whole = logits_rows.shape[0] == x.shape[0]
                    return every if whole else every[logits_rows]
            x = self._layers_fused(x, rope_rows, kv, meta, kernels)
            logits: torch.Tensor = self.lm_head(self.norm(x[logits_rows]))
            return logits.float()
        cos = self.rope_cos[rope_rows].unsqueeze(1).to(x.dtype)  # [tokens, 1, rotary_dim]
        sin = self.rope_sin[rope_rows].unsqueeze(1).to(x.dtype)
        for index, layer in enumerate(self.typed_layers()):
            layer_kv = kv.layer(index)
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, layer_kv, meta)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.norm(x[logits_rows])  # [rows, hidden]
        logits = self.lm_head(x)
        return logits.float()

    def _layers_fused(
        self,
        x: torch.Tensor,  # [tokens, hidden] the embeddings; becomes the residual stream
        rope_rows: torch.Tensor,  # [tokens] int64 rows of the rope tables (the positions)
        kv: KVPool,
        meta: AttentionMetadata,
        kernels: StepKernels,
    ) -> torch.Tensor:  # [tokens, hidden] the last layer's residual stream
        """The layers with the native kernels' fused elementwise ops: each residual add and
        the norm after it in one pass, rotary embedding in place on the fused qkv rows, and
        SwiGLU's activation in one op. Same arithmetic as the unfused path, far fewer ops.
        Where the library also writes K/V as it rotates (Triton's `rope_and_cache_`), the
        rotation and the pool write are one kernel."""
        c = self.config
        layers = self.typed_layers()
        residual = x
        normed = kernels.rms_norm(x, layers[0].input_layernorm.weight, c.norm_eps)
        for index, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = attn.qkv_proj(normed)  # [tokens, q_size + 2 * kv_size]
            layer_kv = kv.layer(index)
            written = attn.rotate_(
                qkv, rope_rows, self.rope_cos, self.rope_sin, kernels, layer_kv, meta
            )
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            hidden = attn.attend(q, k, v, layer_kv, meta, kv_written=written)
            post = layer.post_attention_layernorm.weight
            normed = kernels.rms_norm(hidden, post, c.norm_eps, residual=residual)
            if isinstance(mlp, SparseMoE):
                hidden = mlp(normed)
            else:
                hidden = mlp.down_proj(kernels.silu_mul(mlp.gate_up_proj(normed)))
            if index + 1 < len(layers):
                following = layers[index + 1].input_layernorm.weight
                normed = kernels.rms_norm(hidden, following, c.norm_eps, residual=residual)
            else:
                residual += hidden
        return residual

    def typed_layers(self) -> list[LlamaLayer]:
        return [layer for layer in self.layers if isinstance(layer, LlamaLayer)]

    def load_weights(self, src: WeightSource) -> None:
        c = self.config
        h = c.hidden_size
        # not held in a local: the source copy of a large table is freed as soon as it is in
        fill_embedding(
            self, "embed_tokens", src.take_linear("model.embed_tokens.weight", (c.vocab_size, h))
        )
        for n, layer in enumerate(self.typed_layers()):
            p = f"model.layers.{n}."
            load_attention(layer.self_attn, src, p + "self_attn.", c)
            if isinstance(layer.mlp, SparseMoE):
                layer.mlp.load(src, p, EXPERT_NAMES[c.arch])
            else:
                load_gated_mlp(layer.mlp, src, p + "mlp.", c)
            copy_into(layer.input_layernorm.weight, src.take(p + "input_layernorm.weight", (h,)))
            copy_into(
                layer.post_attention_layernorm.weight,
                src.take(p + "post_attention_layernorm.weight", (h,)),
            )
        copy_into(self.norm.weight, src.take("model.norm.weight", (h,)))
        if not c.tie_word_embeddings:
            fill_linear(self, "lm_head", [src.take_linear("lm_head.weight", (c.vocab_size, h))])
