"""Model architecture description, independent of where the weights come from.

`ModelConfig` is built from a Hugging Face `config.json` or from GGUF metadata, and is the
only thing the model code, the KV pool and the memory planner read.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu.errors import CheckpointError, UnsupportedArchitecture

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


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(x) for x in value)
    return (int(value),)


def config_from_hf(raw: dict[str, Any], source: Path) -> ModelConfig:
    """Build a ModelConfig from a parsed Hugging Face `config.json`."""
    model_type = raw.get("model_type")
    model_type = MODEL_TYPES.get(str(model_type), model_type)
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            source,
            f"model_type {model_type!r} is not supported (supported: {', '.join(ARCHITECTURES)})",
        )
    try:
        if model_type in GEMMA_FAMILY:
            return _gemma_config(model_type, raw, source)
        if model_type == "gpt2":
            hidden = int(raw["n_embd"])
            heads = int(raw["n_head"])
            return ModelConfig(
                arch="gpt2",
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                num_layers=int(raw["n_layer"]),
                num_heads=heads,
                num_kv_heads=heads,
                head_dim=hidden // heads,
                intermediate_size=int(raw.get("n_inner") or 4 * hidden),
                max_position_embeddings=int(raw["n_positions"]),
                norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
                activation=str(raw.get("activation_function", "gelu_new")),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=_eos_ids(raw.get("eos_token_id")),
            )
        if raw.get("mlp_bias"):
            raise UnsupportedArchitecture(source, "mlp_bias = true is not supported")
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        sliding = raw.get("sliding_window")
        if model_type in ("qwen2", "qwen3", "qwen3_moe") and not raw.get("use_sliding_window"):
            sliding = None
        return ModelConfig(
            arch=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            rope_theta=float(_rope_theta(raw)),
            rope_scaling=_rope_scaling(raw, source),
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            output_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
            sliding_window=int(sliding) if sliding else None,
            activation=str(raw.get("hidden_act", "silu")),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_eos_ids(raw.get("eos_token_id")),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            partial_rotary_factor=_partial_rotary_factor(raw),
            **_experts(model_type, raw, source),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(source, f"config.json is missing or has a bad field: {exc}") from exc


def _gemma_config(arch: str, raw: dict[str, Any], source: Path) -> ModelConfig:
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    layers = int(raw["num_hidden_layers"])
    params = raw.get("rope_parameters") or {}
    # transformers 5 writes Gemma 3's rope settings per layer type; older files keep them flat.
    full = params.get(FULL, params) if arch == "gemma3" else params
    local = params.get(SLIDING, {}) if arch == "gemma3" else {}
    theta = float(full.get("rope_theta", raw.get("rope_theta", 10000.0)))
    local_theta = float(local.get("rope_theta", raw.get("rope_local_base_freq", 10000.0)))
    scaling = raw.get("rope_scaling") or (full if full.get("rope_type") else None)
    pattern = 6 if arch == "gemma3" else 2  # every pattern-th layer global, when not listed
    pattern = int(
        raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or pattern
    )
    default_types = tuple(SLIDING if (i + 1) % pattern else FULL for i in range(layers))
    types = tuple(str(t) for t in raw.get("layer_types") or default_types)
    if len(types) != layers or not set(types) <= {SLIDING, FULL}:
        raise CheckpointError(source, f"layer_types must be {layers} of {SLIDING}, {FULL}")
    sliding = raw.get("sliding_window")
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedArchitecture(source, "use_bidirectional_attention is not supported")
    return ModelConfig(
        arch=arch,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        intermediate_size=int(raw["intermediate_size"]),
        max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        rope_theta=theta,
        rope_scaling=_rope_scaling({"rope_scaling": scaling}, source),
        attention_bias=bool(raw.get("attention_bias", False)),
        output_bias=bool(raw.get("attention_bias", False)),
        sliding_window=int(sliding) if sliding and SLIDING in types else None,
        activation=str(
            raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        ),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos_ids(raw.get("eos_token_id")),
        layer_types=types,
        qk_norm=arch == "gemma3",
        query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
        # Gemma 3's attention ignores attn_logit_softcapping (transformers 5.24 never passes it).
        attn_logit_softcapping=_optional_float(raw, "attn_logit_softcapping")
        if arch == "gemma2"
        else None,
        final_logit_softcapping=_optional_float(raw, "final_logit_softcapping"),
        rope_local_theta=local_theta if arch == "gemma3" else None,
    )


def _optional_float(raw: dict[str, Any], name: str) -> float | None:
    value = raw.get(name)
    return None if value is None else float(value)


def _rope_theta(raw: dict[str, Any]) -> float:
    # transformers 5 moves rope settings into `rope_parameters`; older files keep them flat.
    params = raw.get("rope_parameters") or {}
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


def _partial_rotary_factor(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters") or {}
    return float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))


def _experts(model_type: str, raw: dict[str, Any], source: Path) -> dict[str, Any]:
    """The ModelConfig fields of a sparse MLP (none for dense models)."""
    if model_type not in MOE_ARCHS:
        return {}
    dense: tuple[int, ...] = ()
    if model_type == "qwen3_moe":  # as Qwen3MoeDecoderLayer picks each layer's MLP
        step = int(raw.get("decoder_sparse_step", 1))
        only = {int(n) for n in raw.get("mlp_only_layers") or ()}
        layers = range(int(raw["num_hidden_layers"]))
        dense = tuple(n for n in layers if n in only or (n + 1) % step)
    experts = int(raw.get("num_local_experts") or raw.get("num_experts") or 0)
    top_k = int(raw["num_experts_per_tok"])
    if not 0 < top_k <= experts:
        raise CheckpointError(source, f"num_experts_per_tok {top_k} of {experts} experts")
    return {
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        # Mixtral's experts are `intermediate_size` wide; Qwen3-MoE names theirs apart.
        "moe_intermediate_size": int(raw.get("moe_intermediate_size") or raw["intermediate_size"]),
        "norm_topk_prob": model_type == "mixtral" or bool(raw.get("norm_topk_prob", False)),
        "dense_layers": dense,
    }


SUPPORTED_ROPE_SCALING = ("linear", "llama3", "longrope")


def _rope_scaling(raw: dict[str, Any], source: Path) -> dict[str, Any] | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    kind = "longrope" if kind == "su" else kind  # Phi-3's first name for it
    if kind not in SUPPORTED_ROPE_SCALING:
        raise UnsupportedArchitecture(
            source,
            f"rope scaling {kind!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_SCALING)})",
        )
    if kind == "longrope":  # Phi-3 keeps the pretrained length beside rope_scaling
        original = scaling.get("original_max_position_embeddings")
        original = original or raw["original_max_position_embeddings"]
        return dict(scaling, rope_type=kind, original_max_position_embeddings=int(original))
    return dict(scaling, rope_type=kind)


SUPPORTED_ACTIVATIONS = {
    "gpt2": ("gelu_new", "gelu_pytorch_tanh"),
    "llama": ("silu",),
    "gemma": ("gelu_pytorch_tanh",),
}


def check_activation(config: ModelConfig, source: Path) -> None:
    family = "gpt2" if config.arch == "gpt2" else "llama"
    family = "gemma" if config.arch in GEMMA_FAMILY else family
    if config.activation not in SUPPORTED_ACTIVATIONS[family]:
        raise UnsupportedArchitecture(
            source, f"activation {config.activation!r} is not supported for {config.arch}"
        )


def load_hf_config(folder: Path) -> ModelConfig:
    """Read `folder/config.json` (planning needs nothing else)."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(path, "config.json not found")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"cannot parse config.json: {exc}") from exc
    config = config_from_hf(raw, path)
    check_activation(config, path)
    # Instruct checkpoints often list their end-of-turn token only in generation_config.json.
    generation = folder / "generation_config.json"
    if generation.is_file():
        try:
            extra = _eos_ids(json.loads(generation.read_text()).get("eos_token_id"))
        except (OSError, json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise CheckpointError(generation, f"cannot parse: {exc}") from exc
        eos = tuple(dict.fromkeys((*config.eos_token_ids, *extra)))
        config = dataclasses.replace(config, eos_token_ids=eos)
    return config
