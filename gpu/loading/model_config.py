"""Parsers of model architecture descriptions: a Hugging Face `config.json` into a
`ModelConfig` (`gpu/model_config.py`, the value itself)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from gpu.errors import CheckpointError, UnsupportedArchitecture
from gpu.model_config import (
    ARCHITECTURES,
    FULL,
    GEMMA_FAMILY,
    MODEL_TYPES,
    MOE_ARCHS,
    SLIDING,
    ModelConfig,
)


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
        # the file's window, as written: transformers keeps window // 2 + 1 as an exclusive
        # bound on |q - k| (`gpu.encoder.attention`)
        bidirectional=bool(raw.get("use_bidirectional_attention", False)),
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
