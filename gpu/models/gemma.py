"""Gemma 2 and Gemma 3 (text): Llama's shape with Gemma's differences.

Embeddings scaled by sqrt(hidden); RMSNorm scaling by (1 + weight); a norm before and after
both attention and the MLP; GeGLU with tanh GELU; attention scaled by
`query_pre_attn_scalar ** -0.5`. Layers alternate between sliding-window attention and full
attention (`ModelConfig.layer_types`). Gemma 2 soft-caps its attention scores and its logits;
Gemma 3 normalises each head of q and k and gives its sliding layers their own RoPE base.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from gpu.backends.layer_ops import AttentionShape, LayerOps, Rope, split_heads
from gpu.backends.metadata import AttentionMetadata, ModelInputs
from gpu.kv_pool import KVPool, LayerKV
from gpu.model_config import ModelConfig
from gpu.models.layers import (
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


class GemmaRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))  # stored as the offset from 1
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., size]
        # All in float32, the weight too, then back: Gemma rounds once, after the scaling.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).type_as(x)


def gemma_rope_tables(
    config: ModelConfig, max_positions: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """cos, sin of the full layers, then of the sliding layers: each [positions, head_dim]."""
    cos, sin = rope_tables(config, max_positions)
    if config.rope_local_theta is None:
        return cos, sin, cos, sin
    local = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
    local_cos, local_sin = rope_tables(local, max_positions)
    return cos, sin, local_cos, local_sin


class GemmaAttention(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.config = config
        self.window = config.layer_window(index)
        self.shape = AttentionShape.of(config, window=self.window)
        self.qkv_proj = nn.Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.output_bias)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = GemmaRMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        rope: Rope,  # this layer type's
        kv: LayerKV,
        meta: AttentionMetadata,
        ops: LayerOps,
    ) -> torch.Tensor:  # [tokens, hidden]
        qkv = self.qkv_proj(x)  # [tokens, q_size + 2 * kv_size]
        if self.q_norm is not None and self.k_norm is not None:  # in place, before the rotation
            q, k, _ = split_heads(qkv, self.shape)
            q.copy_(self.q_norm(q))
            k.copy_(self.k_norm(k))
        out = ops.attention(qkv, self.shape, rope, kv, meta)  # [tokens, heads, head_dim]
        hidden: torch.Tensor = self.o_proj(out.flatten(1))
        return hidden


class GemmaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:  # x: [tokens, hidden]
        out: torch.Tensor = self.down_proj(ops.gelu_tanh_mul(self.gate_up_proj(x)))
        return out


class GemmaLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.self_attn = GemmaAttention(config, index)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.mlp = GemmaMLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden] the residual stream
        rope: Rope,
        kv: LayerKV,
        meta: AttentionMetadata,
        ops: LayerOps,
    ) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), rope, kv, meta, ops)
        x = x + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(x), ops)
        out: torch.Tensor = x + self.post_feedforward_layernorm(mlp)
        return out


class GemmaForCausalLM(nn.Module):
    rope_cos: torch.Tensor  # [positions, head_dim] float32, the full layers'
    rope_sin: torch.Tensor
    local_rope_cos: torch.Tensor  # the sliding layers'
    local_rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GemmaLayer(config, i) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.norm_eps)
        # An encoder (EmbeddingGemma) has no head: its hidden states are pooled (`gpu.encoder`)
        self.lm_head: nn.Linear | None = None
        if not config.bidirectional:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            if config.tie_word_embeddings:
                self.lm_head.weight = self.embed_tokens.weight
        if not on_meta():  # there, the loader fills them once materialised
            self.fill_rope(max_positions)

    def fill_rope(self, max_positions: int, device: torch.device | None = None) -> None:
        """(Re)build the RoPE tables in float32: on `device` once materialised from the meta
        device, where buffer values are lost and the compute dtype would round them."""
        tables = gemma_rope_tables(self.config, max_positions)
        names = ("rope_cos", "rope_sin", "local_rope_cos", "local_rope_sin")
        for name, table in zip(names, tables, strict=True):
            self.register_buffer(
                name, table if device is None else table.to(device), persistent=False
            )

    def forward(
        self, inputs: ModelInputs, kv: KVPool, ops: LayerOps
    ) -> torch.Tensor:  # [rows, vocab] float32
        if self.lm_head is None:
            raise TypeError("an encoder has no LM head: run it through gpu.encoder")
        x = self.residual_stream(inputs, kv, ops)  # [tokens, hidden]
        logits: torch.Tensor = self.lm_head(self.norm(x[inputs.logits_rows])).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def hidden_states(
        self, inputs: ModelInputs, kv: KVPool, ops: LayerOps
    ) -> torch.Tensor:  # [tokens, hidden]
        """Every token's final-normed hidden state (what an encoder pools; `gpu.encoder`)."""
        out: torch.Tensor = self.norm(self.residual_stream(inputs, kv, ops))
        return out

    def residual_stream(
        self, inputs: ModelInputs, kv: KVPool, ops: LayerOps
    ) -> torch.Tensor:  # [tokens, hidden] after the last layer, before the final norm
        x = self.embed_tokens(inputs.input_ids)  # [tokens, hidden]
        # The scale rounded to the model's dtype first, as transformers does (bf16: 55.5, not
        # sqrt(3072) = 55.43), so the embeddings match its bits.
        x = x * embedding_scale(self.config.hidden_size, x.dtype)
        rows = inputs.rope_rows
        full = ops.rope(self.rope_cos, self.rope_sin, rows, x.dtype)
        local = ops.rope(self.local_rope_cos, self.local_rope_sin, rows, x.dtype)
        for index, layer in enumerate(self.typed_layers()):
            rope = local if layer.self_attn.window is not None else full
            x = layer(x, rope, kv.layer(index), inputs.attention, ops)
        out: torch.Tensor = x
        return out

    def typed_layers(self) -> list[GemmaLayer]:
        return [layer for layer in self.layers if isinstance(layer, GemmaLayer)]

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
            load_gated_mlp(layer.mlp, src, p + "mlp.", c)
            for name in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ):
                norm = getattr(layer, name)
                copy_into(norm.weight, src.take(p + name + ".weight", (h,)))
        copy_into(self.norm.weight, src.take("model.norm.weight", (h,)))
        if not c.tie_word_embeddings and self.lm_head is not None:
            fill_linear(self, "lm_head", [src.take_linear("lm_head.weight", (c.vocab_size, h))])


@functools.cache
def embedding_scale(hidden: int, dtype: torch.dtype) -> float:
    """sqrt(hidden) rounded to `dtype`, as a Python number: no tensor is made per step."""
    return float(torch.tensor(hidden**0.5, dtype=dtype))
