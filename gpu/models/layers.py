"""Building blocks shared by the model files: RMSNorm, rotary embeddings, weight checks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpu.errors import CheckpointError
from gpu.loading.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [tokens, hidden]
        # Normalise in float32 whatever the compute dtype, as the reference implementation does.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:  # [rotary_dim / 2]
    dim = config.rotary_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    assert scaling["rope_type"] != "longrope", "LongRoPE has two sets: longrope_tables"
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: low frequencies are scaled by `factor`, high ones kept, the band between blended.
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


def rope_tables(config: ModelConfig, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [rows, rotary_dim], in float32 (rotate-half layout).

    One row per position (rows = max_positions), except LongRoPE's: see `longrope_tables`."""
    if config.rope_scaling is not None and config.rope_scaling["rope_type"] == "longrope":
        return longrope_tables(config, max_positions)
    return _cos_sin(torch.arange(max_positions), rope_inverse_frequencies(config))


def _cos_sin(
    positions: torch.Tensor,  # [rows]
    inv_freq: torch.Tensor,  # [rotary_dim / 2]
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:  # each [rows, rotary_dim]
    freqs = torch.outer(positions.float(), inv_freq)  # [rows, rotary_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    if scale == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * scale, emb.sin() * scale


def longrope_tables(config: ModelConfig, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """LongRoPE (Phi-3): cos and sin, [max_positions + original, rotary_dim].

    transformers rotates by the short factors while a sequence has at most `original`
    (original_max_position_embeddings) positions, by the long ones from then on; when a
    sequence grows past `original` during generation it recomputes the whole cache with the
    long factors (Phi3ForCausalLM.prepare_inputs_for_generation), and so does the engine. Rows
    [0, max_positions) hold the short factors below `original` and the long ones from there
    on; rows max_positions + p (p < original) the long ones, for sequences longer than
    `original` (`long_rope_rows`). cos and sin carry the attention factor, as transformers'."""
    scaling = config.rope_scaling
    assert scaling is not None
    original = int(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or config.max_position_embeddings / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    dim = config.rotary_dim
    base = config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    short = 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32) * base)
    long = 1.0 / (torch.tensor(scaling["long_factor"], dtype=torch.float32) * base)
    positions = torch.arange(max_positions)
    split = min(original, max_positions)
    short_cos, short_sin = _cos_sin(positions[:split], short, attention)
    long_cos, long_sin = _cos_sin(positions, long, attention)
    cos = torch.cat((short_cos, long_cos[split:], long_cos[:original]))
    sin = torch.cat((short_sin, long_sin[split:], long_sin[:original]))
    return cos, sin


def long_rope_rows(config: ModelConfig) -> tuple[int, int] | None:
    """For LongRoPE: (original, max_positions): a sequence longer than `original` reads its
    rotation at position p < original from row max_positions + p of `longrope_tables`. None
    for every other model (row = position)."""
    scaling = config.rope_scaling
    if scaling is None or scaling["rope_type"] != "longrope":
        return None
    return int(scaling["original_max_position_embeddings"]), config.max_position_embeddings


def apply_rope(
    x: torch.Tensor,  # [tokens, heads, head_dim]
    cos: torch.Tensor,  # [tokens, 1, rotary_dim]
    sin: torch.Tensor,  # [tokens, 1, rotary_dim]
) -> torch.Tensor:
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:  # partial rotary: the rest of each head passes through
        return torch.cat((apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class WeightSource:
    """Hands out checkpoint tensors by name, checking each one's presence and shape."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], path: Path) -> None:
        self.tensors = tensors
        self.path = path

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = self.tensors.get(name)
        if tensor is None:
            raise CheckpointError(self.path, f"tensor {name!r} is missing")
        if tuple(tensor.shape) != shape:
            raise CheckpointError(
                self.path, f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}"
            )
        return tensor

    def first(self, names: tuple[str, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The first of several spellings of one tensor (checkpoints differ in prefixes)."""
        for name in names:
            if name in self.tensors:
                return self.take(name, shape)
        raise CheckpointError(self.path, f"tensor {names[0]!r} is missing")


def copy_into(param: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        param.copy_(value)  # casts to the parameter's dtype and moves it to its device


class FusedAttention(Protocol):
    """An attention module as the model files hold one: q/k/v fused into one projection."""

    qkv_proj: nn.Linear
    o_proj: nn.Linear
    q_norm: Any  # a norm over head_dim when the config has qk_norm
    k_norm: Any


class GatedMLP(Protocol):
    gate_up_proj: nn.Linear  # gate, then up
    down_proj: nn.Linear


def load_attention(attn: FusedAttention, src: WeightSource, p: str, c: ModelConfig) -> None:
    """q/k/v (fused as held, or as Phi-3 stores them), o_proj, biases and q/k norms of one
    layer's attention under prefix `p` (`model.layers.N.self_attn.`)."""
    h, q, kv = c.hidden_size, c.q_size, c.kv_size
    if p + "qkv_proj.weight" in src.tensors:  # Phi-3 stores them fused, as we hold them
        copy_into(attn.qkv_proj.weight, src.take(p + "qkv_proj.weight", (q + 2 * kv, h)))
    else:
        qkv = [
            src.take(p + "q_proj.weight", (q, h)),
            src.take(p + "k_proj.weight", (kv, h)),
            src.take(p + "v_proj.weight", (kv, h)),
        ]
        copy_into(attn.qkv_proj.weight, torch.cat(qkv))
    if c.attention_bias:
        bias = [
            src.take(p + "q_proj.bias", (q,)),
            src.take(p + "k_proj.bias", (kv,)),
            src.take(p + "v_proj.bias", (kv,)),
        ]
        copy_into(attn.qkv_proj.bias, torch.cat(bias))
    copy_into(attn.o_proj.weight, src.take(p + "o_proj.weight", (h, q)))
    if c.output_bias:
        copy_into(attn.o_proj.bias, src.take(p + "o_proj.bias", (h,)))
    if c.qk_norm:  # over each head's head_dim
        copy_into(attn.q_norm.weight, src.take(p + "q_norm.weight", (c.head_dim,)))
        copy_into(attn.k_norm.weight, src.take(p + "k_norm.weight", (c.head_dim,)))


def load_gated_mlp(mlp: GatedMLP, src: WeightSource, p: str, c: ModelConfig) -> None:
    """gate/up (fused as held) and down of one layer's gated MLP under prefix `p`."""
    h, i = c.hidden_size, c.intermediate_size
    if p + "gate_up_proj.weight" in src.tensors:  # Phi-3: fused, gate then up, as we hold them
        copy_into(mlp.gate_up_proj.weight, src.take(p + "gate_up_proj.weight", (2 * i, h)))
    else:
        gate_up = [src.take(p + "gate_proj.weight", (i, h)), src.take(p + "up_proj.weight", (i, h))]
        copy_into(mlp.gate_up_proj.weight, torch.cat(gate_up))
    copy_into(mlp.down_proj.weight, src.take(p + "down_proj.weight", (h, i)))
