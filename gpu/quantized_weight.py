"""A weight matrix held quantized: integers in groups along the input features, a float32 scale
(and optionally an offset) per group.

One layout serves every source: `tokenmill quantize` and `--quantization int8|int4` (from float
weights) and GGUF's block formats (`gpu.loading.gguf_quants.to_quantized`, which maps Q4_0,
Q4_1 and Q4_K onto 4 bits and Q5_x, Q6_K, Q8_0 onto 8 bits without loss):

    w[o, i] = scales[o, i // group] * q[o, i] + offsets[o, i // group]   (offsets None: 0)

- bits 8: `data` int8 [out, in], q in [-128, 127];
- bits 4: `data` uint8 [out, in // 2], q in [0, 15]: element 2j in the low nibble of byte j,
  element 2j + 1 in the high one.

Groups never straddle rows (`in % group == 0`); per-output-channel scales are `group == in`.
Everything is contiguous on one device, so kernels take raw pointers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

BITS = (8, 4)


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    bits: int
    group: int
    data: torch.Tensor  # int8 [out, in] | uint8 [out, in // 2]
    scales: torch.Tensor  # float32 [out, in // group]
    offsets: torch.Tensor | None  # float32 [out, in // group], or None for 0

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"{self.bits}-bit weights: expected one of {BITS}")
        out = self.data.shape[0]
        want = torch.int8 if self.bits == 8 else torch.uint8
        if self.data.dim() != 2 or self.data.dtype != want:
            raise ValueError(f"{self.bits}-bit data must be a 2-D {want} tensor")
        inputs = self.in_features
        if self.group <= 0 or inputs % self.group:
            raise ValueError(f"group {self.group} does not divide {inputs} input features")
        groups = (out, inputs // self.group)
        for name, t in (("scales", self.scales), ("offsets", self.offsets)):
            if t is None:
                continue
            if tuple(t.shape) != groups or t.dtype != torch.float32:
                raise ValueError(f"{name} must be float32 {groups}, not {t.dtype} {tuple(t.shape)}")
            if t.device != self.data.device:
                raise ValueError(f"{name} are on {t.device}, the data on {self.data.device}")
        if not all(t.is_contiguous() for t in self.tensors()):
            raise ValueError("quantized tensors must be contiguous")

    @property
    def out_features(self) -> int:
        return int(self.data.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.data.shape[1]) * (2 if self.bits == 4 else 1)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def scheme(self) -> str:
        """How it is named in results, metrics and reports: `int8-g32`, `int4-g128`, `int8`
        (per output channel)."""
        name = f"int{self.bits}"
        return name if self.group == self.in_features else f"{name}-g{self.group}"

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.data, self.scales, self.offsets) if t is not None)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def integers(self) -> torch.Tensor:  # int16 [out, in]: q, unpacked
        if self.bits == 8:
            return self.data.to(torch.int16)
        low = (self.data & 0x0F).to(torch.int16)
        high = (self.data >> 4).to(torch.int16)
        return torch.stack((low, high), dim=-1).reshape(self.out_features, self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [out, in]
        """The float matrix the integers stand for (the reference every kernel is held to)."""
        out, inputs = self.shape
        q = self.integers().float().view(out, -1, self.group)  # [out, groups, group]
        w = q * self.scales[..., None]
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return w.view(out, inputs).to(dtype)

    def rows(self, index: torch.Tensor) -> QuantizedWeight:
        """Rows `index` (int64 [k]) of the matrix, in that order (GGUF's q/k un-permutation,
        an embedding's looked-up rows)."""
        offsets = None if self.offsets is None else self.offsets[index].contiguous()
        return QuantizedWeight(
            self.bits,
            self.group,
            self.data[index].contiguous(),
            self.scales[index].contiguous(),
            offsets,
        )

    def widened(self, bits: int, group: int) -> QuantizedWeight:
        """The same values with more bits and/or smaller groups, exactly (so matrices of
        different formats can be fused into one): 4 → 8 bits keeps q in [0, 15]; a group is
        split into sub-groups that repeat its scale and offset."""
        if bits < self.bits or self.group % group:
            raise ValueError(f"{self.scheme} cannot be widened to int{bits} groups of {group}")
        data = self.data if bits == self.bits else self.integers().to(torch.int8)
        repeat = self.group // group
        scales = self.scales.repeat_interleave(repeat, dim=1)
        offsets = None if self.offsets is None else self.offsets.repeat_interleave(repeat, dim=1)
        return QuantizedWeight(bits, group, data.contiguous(), scales, offsets)

    def to(self, device: torch.device) -> QuantizedWeight:
        offsets = None if self.offsets is None else self.offsets.to(device)
        return QuantizedWeight(
            self.bits, self.group, self.data.to(device), self.scales.to(device), offsets
        )


def concatenated(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
    """Matrices stacked along the output rows (q, k, v → qkv; gate, up → gate_up), each first
    widened to the most bits and the smallest group among them, so no value changes."""
    if len({p.in_features for p in parts}) != 1:
        raise ValueError("fused matrices must have the same input features")
    bits = max(p.bits for p in parts)
    group = min(p.group for p in parts)
    if any(p.group % group for p in parts):
        group = _common_group(parts)
    same = [p.widened(bits, group) for p in parts]
    if any(p.offsets is not None for p in same):
        offsets = torch.cat(
            [p.offsets if p.offsets is not None else torch.zeros_like(p.scales) for p in same]
        )
    else:
        offsets = None
    return QuantizedWeight(
        bits,
        group,
        torch.cat([p.data for p in same]),
        torch.cat([p.scales for p in same]),
        offsets,
    )


def _common_group(parts: Sequence[QuantizedWeight]) -> int:
    import math

    return math.gcd(*(p.group for p in parts))


def quantize_int8(w: torch.Tensor, group: int | None = None) -> QuantizedWeight:
    """Symmetric int8: per output channel (`group` None) or per `group` input features;
    scale = max |w| / 127 over the group, q = round(w / scale)."""
    out, inputs = w.shape
    group = group or inputs
    g = w.detach().float().reshape(out, inputs // group, group)  # [out, groups, group]
    scales = g.abs().amax(-1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero group
    q = torch.round(g / scales[..., None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(8, group, q.reshape(out, inputs).contiguous(), scales.contiguous(), None)


def quantize_int4(w: torch.Tensor, group: int = 32) -> QuantizedWeight:
    """Asymmetric int4 per `group` input features: the group's [min, max] in 15 steps,
    w ≈ scale · q + min with q in [0, 15] (the zero point is the offset)."""
    out, inputs = w.shape
    if inputs % group or group % 2:
        raise ValueError(f"group {group} does not divide {inputs} input features evenly")
    g = w.detach().float().reshape(out, inputs // group, group)
    low, high = g.amin(-1), g.amax(-1)
    scales = (high - low) / 15.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round((g - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.reshape(out, inputs // 2, 2)
    packed = (q[..., 0] | (q[..., 1] << 4)).contiguous()
    return QuantizedWeight(4, group, packed, scales.contiguous(), low.contiguous())
