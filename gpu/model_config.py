"""Model architecture description: the engine's most basic value.

`ModelConfig` is what the model code, the KV pool, the backends and the memory planner read.
It imports nothing of gpu/: the parsers that build it from a Hugging Face `config.json`
(`gpu/loading/model_config.py`) or from GGUF metadata (`gpu/loading/gguf_config.py`) sit above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "phi3", "mixtral", "qwen3_moe")
MOE_ARCHS = ("mixtral", "qwen3_moe")  # sparse MLPs: gpu/models/moe.py
GEMMA_FAMILY = ("gemma2", "gemma3")  # gemma3: the text model (HF "gemma3_text", GGUF "gemma3")
ARCHITECTURES = (*LLAMA_FAMILY, "gpt2", *GEMMA_FAMILY)
MODEL_TYPES = {"gemma3_text": "gemma3"}  # HF model_type -> arch, where the names differ
SLIDING, FULL = "sliding_attention", "full_attention"  # the entries of `layer_types`


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of one decoder-only transformer."""

    arch: str  # one of ARCHITECTURES
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    tie_word_embeddings: bool
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    output_bias: bool = False  # Llama with attention_bias: bias on o_proj too
    sliding_window: int | None = None
    activation: str = "silu"  # llama family: silu; gpt2: gelu_new
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # Per layer SLIDING or FULL; None: every layer is SLIDING where `sliding_window` is set
    # (Mistral), else FULL. A sliding layer's query at p sees positions (p - window, p].
    layer_types: tuple[str, ...] | None = None
    qk_norm: bool = False  # RMSNorm on each head of q and k before RoPE (Gemma 3, Qwen3)
    query_pre_attn_scalar: float | None = None  # scale = its ** -0.5 (Gemma); None: head_dim
    attn_logit_softcapping: float | None = None  # scores = cap · tanh(scores / cap) (Gemma 2)
    final_logit_softcapping: float | None = None  # the same on the logits (Gemma 2)
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3)
    partial_rotary_factor: float = 1.0  # RoPE on the first fraction of each head (Phi-4-mini)
    num_experts: int = 0  # > 0: every layer's MLP is a sparse mixture of experts
    num_experts_per_tok: int = 0  # experts each token is routed to (top-k)
    moe_intermediate_size: int | None = None  # one expert's intermediate size
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
    dense_layers: tuple[int, ...] = ()  # an MoE model's layers with a dense MLP (Qwen3-MoE)
    # An encoder (EmbeddingGemma: `use_bidirectional_attention`): every token sees the whole
    # sequence, a sliding layer's |q - k| <= sliding_window // 2; no LM head (`gpu.encoder`).
    bidirectional: bool = False

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_scale(self) -> float:
        return 1.0 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

    def layer_window(self, index: int) -> int | None:
        """Layer `index`'s sliding window (positions a query sees, itself included); None: all."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[index] == SLIDING:
            return self.sliding_window
        return None

    def num_parameters(self) -> int:
        """Parameter count from the shapes alone (planning needs no weights)."""
        h, v, i, n = self.hidden_size, self.vocab_size, self.intermediate_size, self.num_layers
        embed = v * h
        head = 0 if self.tie_word_embeddings else v * h
        if self.arch == "gpt2":
            pos = self.max_position_embeddings * h
            attn = h * 3 * h + 3 * h + h * h + h
            mlp = h * i + i + i * h + h
            norms = 4 * h
            return embed + pos + n * (attn + mlp + norms) + 2 * h + head
        if self.arch in GEMMA_FAMILY:
            attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
            qk_norms = 2 * self.head_dim if self.qk_norm else 0
            # four norms a layer: before and after attention, before and after the MLP
            return embed + n * (attn + qk_norms + 3 * h * i + 4 * h) + h + head
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.output_bias:
            attn += h
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * h * i
        if self.num_experts:  # the router, then every expert (all are held, a few run)
            sparse = self.num_experts * (h + 3 * h * (self.moe_intermediate_size or i))
            dense = len(self.dense_layers)
            return embed + n * (attn + 2 * h) + (n - dense) * sparse + dense * mlp + h + head
        return embed + n * (attn + mlp + 2 * h) + h + head

    def sparse_layer(self, index: int) -> bool:
        """Whether layer `index`'s MLP is a mixture of experts."""
        return self.num_experts > 0 and index not in self.dense_layers
