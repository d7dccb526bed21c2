"""Building blocks shared by the model files: RMSNorm, rotary embeddings, weight checks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpu.errors import CheckpointError
from gpu.model_config import ModelConfig
from gpu.quantized_weight import QuantizedWeight, concatenated


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [tokens, hidden]
        return rms_norm(x, self.weight, self.eps)


def rms_norm(
    x: torch.Tensor,  # [..., size]
    weight: torch.Tensor,  # [size]
    eps: float,
) -> torch.Tensor:  # [..., size]
    # Normalise in float32 whatever the compute dtype, as the reference implementation does.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


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
    """Hands out checkpoint tensors by name, checking each one's presence and shape.

    `keep_quantized`: `take_linear` hands out a weight the checkpoint holds quantized (a
    GGUF's blocks, or `tokenmill quantize`'s `<name>_q`/`_scales`/`_offsets` tensors) as a
    `QuantizedWeight` instead of dequantizing it."""

    def __init__(
        self, tensors: Mapping[str, torch.Tensor], path: Path, keep_quantized: bool = False
    ) -> None:
        self.tensors = tensors
        self.path = path
        self.keep_quantized = keep_quantized

    def has(self, name: str) -> bool:
        """Whether the checkpoint holds `name`, as a float tensor or quantized."""
        return name in self.tensors or name + "_q" in self.tensors

    def take_linear(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | QuantizedWeight:
        """A [out, in] weight: quantized when the checkpoint holds it so and `keep_quantized`."""
        weight: QuantizedWeight | None = None
        if name + "_q" in self.tensors:  # written by `tokenmill quantize`
            weight = stored_quantized(self.tensors, name, self.path)
        elif self.keep_quantized and name in self.tensors:
            quantized = getattr(self.tensors, "quantized", None)  # a GGUF's blocks
            weight = quantized(name) if quantized is not None else None
        if weight is None:
            return self.take(name, shape)
        if weight.shape != shape:
            raise CheckpointError(
                self.path, f"tensor {name!r} has shape {weight.shape}, expected {shape}"
            )
        return weight if self.keep_quantized else weight.dequantize()

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


def stored_quantized(tensors: Mapping[str, torch.Tensor], name: str, path: Path) -> QuantizedWeight:
    """`name`'s `_q` (int8 [out, in] or uint8 nibbles [out, in / 2]), `_scales` and optional
    `_offsets` tensors as one QuantizedWeight; bits and group follow from their shapes."""
    try:
        data = tensors[name + "_q"].contiguous()
        scales = tensors[name + "_scales"].float().contiguous()
        offsets = (
            tensors[name + "_offsets"].float().contiguous()
            if name + "_offsets" in tensors
            else None
        )
        if data.dtype not in (torch.int8, torch.uint8) or scales.dim() != 2:
            raise ValueError(f"{data.dtype} integers with {scales.dim()}-D scales")
        bits = 8 if data.dtype == torch.int8 else 4
        inputs = data.shape[1] * (1 if bits == 8 else 2)
        if scales.shape[1] == 0 or inputs % scales.shape[1]:
            raise ValueError(f"{scales.shape[1]} groups do not divide {inputs} input features")
        return QuantizedWeight(bits, inputs // scales.shape[1], data, scales, offsets)
    except (KeyError, ValueError) as exc:
        raise CheckpointError(path, f"quantized tensor {name!r} is malformed: {exc}") from exc


def copy_into(param: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        param.copy_(value)  # casts to the parameter's dtype and moves it to its device


def fill_linear(owner: Any, attr: str, parts: list[torch.Tensor | QuantizedWeight]) -> None:
    """Fill `owner.<attr>` (an nn.Linear) with its weight's parts stacked along the rows (q, k,
    v; gate, up). All quantized (a checkpoint kept quantized): the layer becomes a
    QuantizedLinear over them, fused without changing a value; otherwise the float values
    are copied in (quantized parts among float ones are dequantized)."""
    linear = getattr(owner, attr)
    if all(isinstance(p, QuantizedWeight) for p in parts):
        from gpu.quant.linear import QuantizedLinear

        weight = concatenated([p for p in parts if isinstance(p, QuantizedWeight)])
        device = linear.weight.device
        bias = None if linear.bias is None else linear.bias
        setattr(owner, attr, QuantizedLinear(weight.to(device), bias))
        return
    floats = [p.dequantize() if isinstance(p, QuantizedWeight) else p for p in parts]
    copy_into(linear.weight, floats[0] if len(floats) == 1 else torch.cat(floats))


def on_meta() -> bool:
    """Whether modules are being built on the meta device (as the loaders build them): values
    computed there are lost, and torch runs ops on meta tensors through its reference
    implementations, which import torch._dynamo (~3 s of a start-up)."""
    return torch.empty(0).device.type == "meta"


def embedding(rows: int, dim: int) -> nn.Embedding:
    """An nn.Embedding whose weight is left uninitialised (it is loaded next). Its default
    initialisation draws normal values, which on the meta device goes through torch's
    reference ops and imports torch._dynamo: ~3 s of every start-up, for values thrown away."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


def fill_embedding(owner: nn.Module, attr: str, value: torch.Tensor | QuantizedWeight) -> None:
    """Fill `owner.<attr>` (an nn.Embedding); a quantized table becomes a QuantizedEmbedding."""
    embedding = getattr(owner, attr)
    if isinstance(value, QuantizedWeight):
        from gpu.quant.linear import QuantizedEmbedding

        device, dtype = embedding.weight.device, embedding.weight.dtype
        setattr(owner, attr, QuantizedEmbedding(value.to(device), dtype))
        return
    copy_into(embedding.weight, value)


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
    # Phi-3 (and `tokenmill quantize`) store them fused, as we hold them
    if src.has(p + "qkv_proj.weight"):
        fill_linear(attn, "qkv_proj", [src.take_linear(p + "qkv_proj.weight", (q + 2 * kv, h))])
    else:
        qkv = [
            src.take_linear(p + "q_proj.weight", (q, h)),
            src.take_linear(p + "k_proj.weight", (kv, h)),
            src.take_linear(p + "v_proj.weight", (kv, h)),
        ]
        fill_linear(attn, "qkv_proj", qkv)
    if c.attention_bias:
        bias = [
            src.take(p + "q_proj.bias", (q,)),
            src.take(p + "k_proj.bias", (kv,)),
            src.take(p + "v_proj.bias", (kv,)),
        ]
        copy_into(attn.qkv_proj.bias, torch.cat(bias))
    if c.output_bias:
        copy_into(attn.o_proj.bias, src.take(p + "o_proj.bias", (h,)))
    fill_linear(attn, "o_proj", [src.take_linear(p + "o_proj.weight", (h, q))])
    if c.qk_norm:  # over each head's head_dim
        copy_into(attn.q_norm.weight, src.take(p + "q_norm.weight", (c.head_dim,)))
        copy_into(attn.k_norm.weight, src.take(p + "k_norm.weight", (c.head_dim,)))


def load_gated_mlp(mlp: GatedMLP, src: WeightSource, p: str, c: ModelConfig) -> None:
    """gate/up (fused as held) and down of one layer's gated MLP under prefix `p`."""
    h, i = c.hidden_size, c.intermediate_size
    if src.has(p + "gate_up_proj.weight"):  # Phi-3: fused, gate then up, as we hold them
        fill_linear(mlp, "gate_up_proj", [src.take_linear(p + "gate_up_proj.weight", (2 * i, h))])
    else:
        gate_up = [
            src.take_linear(p + "gate_proj.weight", (i, h)),
            src.take_linear(p + "up_proj.weight", (i, h)),
        ]
        fill_linear(mlp, "gate_up_proj", gate_up)
    fill_linear(mlp, "down_proj", [src.take_linear(p + "down_proj.weight", (h, i))])
