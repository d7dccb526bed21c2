"""The Llama family: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Llama, Mistral, Qwen2; Qwen3 (RMSNorm on each q and k head before RoPE); Phi-3/Phi-4 (q/k/v
and gate/up stored fused, LongRoPE, partial rotary); Mixtral and Qwen3-MoE (a sparse mixture
of SwiGLU experts for the MLP: `gpu/models/moe.py`).

Tokens of a step arrive flat (`[tokens]`, no padding); attention reads and writes the paged KV
pool. q/k/v and gate/up are fused into one matmul each when the weights are loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu.backends.layer_ops import AttentionShape, LayerOps, Rope, split_heads
from gpu.backends.metadata import AttentionMetadata, ModelInputs
from gpu.kv_pool import KVPool, LayerKV
from gpu.model_config import ModelConfig
from gpu.models.layers import (
    RMSNorm,
    WeightSource,
    copy_into,
    embedding,
    fill_embedding,
    fill_linear,
    load_attention,
    load_gated_mlp,
    on_meta,
    rope_tables,
)
from gpu.models.moe import EXPERT_NAMES, SparseMoE


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.config = config
        # a sliding window where the config sets one (Mistral-7B-v0.1: 4,096)
        self.shape = AttentionShape.of(config, window=config.layer_window(index))
        self.qkv_proj = nn.Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.output_bias)
        if config.qk_norm:  # Qwen3: over each head's head_dim
            self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden] normed
        rope: Rope,
        kv: LayerKV,
        meta: AttentionMetadata,
        ops: LayerOps,
    ) -> torch.Tensor:  # [tokens, hidden]
        c = self.config
        qkv = self.qkv_proj(x)  # [tokens, q_size + 2 * kv_size]
        if c.qk_norm:  # in place on the fused rows, before the rotation
            q, k, _ = split_heads(qkv, self.shape)
            q.copy_(self.q_norm(q))
            k.copy_(self.k_norm(k))
        out = ops.attention(qkv, self.shape, rope, kv, meta)  # [tokens, heads, head_dim]
        hidden: torch.Tensor = self.o_proj(out.flatten(1))
        return hidden


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:  # x: [tokens, hidden]
        out: torch.Tensor = self.down_proj(ops.silu_mul(self.gate_up_proj(x)))
        return out


class LlamaLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = LlamaAttention(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = SparseMoE(config) if config.sparse_layer(index) else LlamaMLP(config)


class LlamaForCausalLM(nn.Module):
    rope_cos: torch.Tensor  # [positions, head_dim] float32
    rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaLayer(config, n) for n in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # On the meta device the loader fills them once materialised (`gpu.loading.loader`).
        cos, sin = (torch.empty(0),) * 2 if on_meta() else rope_tables(config, max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)  # [positions, head_dim]
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(
        self, inputs: ModelInputs, kv: KVPool, ops: LayerOps
    ) -> torch.Tensor:  # [rows, vocab] float32
        """Each residual add goes with the norm after it (`ops.rms_norm(..., residual=)`)."""
        c, meta = self.config, inputs.attention
        x = self.embed_tokens(inputs.input_ids)  # [tokens, hidden]; becomes the residual
        rope = ops.rope(self.rope_cos, self.rope_sin, inputs.rope_rows, x.dtype)
        layers = self.typed_layers()
        residual = x
        normed = ops.rms_norm(x, layers[0].input_layernorm.weight, c.norm_eps)
        for index, layer in enumerate(layers):
            hidden = layer.self_attn(normed, rope, kv.layer(index), meta, ops)
            post = layer.post_attention_layernorm.weight
            normed = ops.rms_norm(hidden, post, c.norm_eps, residual=residual)
            hidden = layer.mlp(normed, ops)  # SwiGLU, or a mixture of SwiGLU experts
            if index + 1 < len(layers):
                following = layers[index + 1].input_layernorm.weight
                normed = ops.rms_norm(hidden, following, c.norm_eps, residual=residual)
            else:
                residual += hidden
        logits: torch.Tensor = self.lm_head(self.norm(residual[inputs.logits_rows]))
        return logits.float()  # [rows, vocab]

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
