"""Model architecture description, independent of where the weights come from.

`ModelConfig` is built from a Hugging Face `config.json` or from GGUF metadata, and is the
only thing the model code, the KV pool and the memory planner read.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu.errors import CheckpointError, UnsupportedArchitecture

LLAMA_FAMILY = ("llama", "mistral", "qwen2")
ARCHITECTURES = (*LLAMA_FAMILY, "gpt2")


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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

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
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.output_bias:
            attn += h
        mlp = 3 * h * i
        return embed + n * (attn + mlp + 2 * h) + h + head


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(x) for x in value)
    return (int(value),)


def config_from_hf(raw: dict[str, Any], source: Path) -> ModelConfig:
    """Build a ModelConfig from a parsed Hugging Face `config.json`."""
    model_type = raw.get("model_type")
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            source,
            f"model_type {model_type!r} is not supported (supported: {', '.join(ARCHITECTURES)})",
        )
    try:
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
        if model_type == "qwen2" and not raw.get("use_sliding_window", False):
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
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(source, f"config.json is missing or has a bad field: {exc}") from exc


def _rope_theta(raw: dict[str, Any]) -> float:
    # transformers 5 moves rope settings into `rope_parameters`; older files keep them flat.
    params = raw.get("rope_parameters") or {}
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


SUPPORTED_ROPE_SCALING = ("linear", "llama3")


def _rope_scaling(raw: dict[str, Any], source: Path) -> dict[str, Any] | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind not in SUPPORTED_ROPE_SCALING:
        raise UnsupportedArchitecture(
            source, f"rope scaling {kind!r} is not supported (supported: linear, llama3)"
        )
    return dict(scaling, rope_type=kind)


SUPPORTED_ACTIVATIONS = {"gpt2": ("gelu_new", "gelu_pytorch_tanh"), "llama": ("silu",)}


def check_activation(config: ModelConfig, source: Path) -> None:
    family = "gpt2" if config.arch == "gpt2" else "llama"
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
