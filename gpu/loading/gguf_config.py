"""A GGUF file's metadata as a `ModelConfig`: the architectures read (llama, qwen2, gemma3),
typed access to the metadata keys (`GGUFMeta`, which the tokenizer reads too), and RoPE scaling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu.errors import CheckpointError, UnsupportedArchitecture
from gpu.loading.gguf_reader import GGUFHeader
from gpu.loading.model_config import config_from_hf
from gpu.model_config import ModelConfig

ARCHITECTURES = ("llama", "qwen2", "gemma3")  # general.architecture values read here


class GGUFMeta:
    """Typed access to GGUF metadata, failing with the key's name."""

    def __init__(self, header: GGUFHeader, path: Path) -> None:
        self.fields = header.fields
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.fields:
            raise CheckpointError(self.path, f"GGUF metadata key {key!r} is missing")
        return self.fields[key]

    def count(self, key: str) -> int | None:
        """Length of an array field."""
        value = self.fields.get(key)
        return None if value is None else len(value)


def config_from_gguf(header: GGUFHeader, path: Path) -> ModelConfig:
    meta = GGUFMeta(header, path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            path,
            f"GGUF general.architecture {arch!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})",
        )
    if meta.get(f"{arch}.expert_count", 0):
        raise UnsupportedArchitecture(path, "mixture-of-experts GGUF models are not supported")
    names = {t.name for t in header.tensors}
    if "rope_freqs.weight" in names:
        raise CheckpointError(
            path, "per-dimension RoPE frequency factors (rope_freqs.weight) are not supported"
        )
    try:
        hidden = int(meta.require(f"{arch}.embedding_length"))
        heads = int(meta.require(f"{arch}.attention.head_count"))
        head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
        rope_dims = meta.get(f"{arch}.rope.dimension_count")
        if rope_dims is not None and int(rope_dims) != head_dim:
            raise CheckpointError(
                path, f"partial rotary embedding ({rope_dims} of {head_dim} dims) is not supported"
            )
        vocab = meta.get(f"{arch}.vocab_size") or meta.count("tokenizer.ggml.tokens")
        if vocab is None:
            raise CheckpointError(path, "no vocab_size and no tokenizer.ggml.tokens in metadata")
        eos_ids: list[int] = []
        for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
            token_id = meta.get(f"tokenizer.ggml.{key}")
            if token_id is not None and int(token_id) not in eos_ids:
                eos_ids.append(int(token_id))
        bos = meta.get("tokenizer.ggml.bos_token_id")
        if arch == "gemma3":
            return _gemma3_config(meta, path, int(vocab), "output.weight" not in names, eos_ids)
        return ModelConfig(
            arch=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            num_layers=int(meta.require(f"{arch}.block_count")),
            num_heads=heads,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            intermediate_size=int(meta.require(f"{arch}.feed_forward_length")),
            max_position_embeddings=int(meta.get(f"{arch}.context_length", 2048)),
            norm_eps=float(meta.require(f"{arch}.attention.layer_norm_rms_epsilon")),
            tie_word_embeddings="output.weight" not in names,
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(meta, arch),
            attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=tuple(eos_ids),
        )
    except (TypeError, ValueError) as exc:  # e.g. a per-layer array where a number belongs
        raise CheckpointError(path, f"bad GGUF metadata value: {exc}") from exc


def _gemma3_config(
    meta: GGUFMeta, path: Path, vocab: int, tied: bool, eos_ids: list[int]
) -> ModelConfig:
    """Gemma 3 as transformers reads it from a GGUF: the metadata renamed to `config.json` keys.

    What the file does not say comes from transformers' `Gemma3TextConfig` defaults, as when
    transformers loads the file: every 6th layer global (the rest sliding), local RoPE base
    10000, query_pre_attn_scalar 256, no soft-capping; `config_from_hf` applies the same.
    """
    head_dim = int(meta.require("gemma3.attention.key_length"))
    value_dim = int(meta.get("gemma3.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise CheckpointError(path, f"key_length {head_dim} != value_length {value_dim}")
    if meta.get("gemma3.rope.scaling.type") not in (None, "none"):
        raise UnsupportedArchitecture(path, "RoPE scaling on a gemma3 GGUF is not supported")
    heads = int(meta.require("gemma3.attention.head_count"))
    raw: dict[str, Any] = {
        "model_type": "gemma3_text",
        "vocab_size": vocab,
        "hidden_size": int(meta.require("gemma3.embedding_length")),
        "num_hidden_layers": int(meta.require("gemma3.block_count")),
        "intermediate_size": int(meta.require("gemma3.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("gemma3.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta.get("gemma3.context_length", 131_072)),
        "rms_norm_eps": float(meta.require("gemma3.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("gemma3.rope.freq_base", 1_000_000.0)),
        "sliding_window": int(meta.get("gemma3.attention.sliding_window", 4096)),
        "tie_word_embeddings": tied,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos_ids or None,
    }
    return config_from_hf(raw, path)


def _rope_scaling(meta: GGUFMeta, arch: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind is None and (legacy := meta.get(f"{arch}.rope.scale_linear")):
        kind, factor = "linear", legacy
    if kind in (None, "none") or (kind == "linear" and float(factor or 1.0) == 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        original = meta.get(f"{arch}.rope.scaling.original_context_length")
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := meta.get(f"{arch}.rope.scaling.{gguf_key}")) is not None:
                scaling[hf_key] = float(value)
        return scaling
    raise CheckpointError(meta.path, f"RoPE scaling type {kind!r} is not supported")
