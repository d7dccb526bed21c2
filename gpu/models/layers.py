"""Building blocks shared by the model files: RMSNorm, rotary embeddings, weight checks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

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


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:  # [head_dim / 2]
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
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
    """cos and sin, each [max_positions, head_dim], in float32 (rotate-half layout)."""
    inv_freq = rope_inverse_frequencies(config)
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)  # [positions, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(
    x: torch.Tensor,  # [tokens, heads, head_dim]
    cos: torch.Tensor,  # [tokens, 1, head_dim]
    sin: torch.Tensor,  # [tokens, 1, head_dim]
) -> torch.Tensor:
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
