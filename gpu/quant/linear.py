"""Linear and embedding layers over quantized weights, and swapping a model's layers for them.

`QuantizedLinear` runs `y = x Wᵀ + b` without a float copy of W: on CPU through the native
kernel (`gpu/kernels/quant_linear.c`, which dequantizes in registers or in cache-sized tiles),
on CUDA through the Triton kernel (`gpu/quant/triton_linear.py`). Where neither is there (no C
compiler, kernels turned off, no Triton) it dequantizes the matrix for each call and warns once:
same numbers, slowly. `QuantizedEmbedding` dequantizes only the rows it looks up.

The integers, scales and offsets are registered buffers (`weight_q`, `weight_scales`,
`weight_offsets`), so memory accounting (`gpu.memory.footprint.engine_bytes`) counts them and
`state_dict()` holds what `tokenmill quantize` writes.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from gpu.quantized_weight import QuantizedWeight

log = logging.getLogger("tokenmill.quant")
_warned: set[str] = set()


class _HoldsQuantized(nn.Module):
    """Holds one QuantizedWeight as buffers, and hands it out (rebuilt only when they move)."""

    weight_q: torch.Tensor
    weight_scales: torch.Tensor
    weight_offsets: torch.Tensor | None

    def __init__(self, weight: QuantizedWeight) -> None:
        super().__init__()
        self.bits, self.group = weight.bits, weight.group
        self.register_buffer("weight_q", weight.data)
        self.register_buffer("weight_scales", weight.scales)
        self.register_buffer("weight_offsets", weight.offsets)
        self._cached: tuple[tuple[int, ...], QuantizedWeight] | None = None

    @property
    def qweight(self) -> QuantizedWeight:
        offsets = self.weight_offsets
        key = (
            self.weight_q.data_ptr(),
            self.weight_scales.data_ptr(),
            0 if offsets is None else offsets.data_ptr(),
        )
        if self._cached is None or self._cached[0] != key:
            weight = QuantizedWeight(
                self.bits, self.group, self.weight_q, self.weight_scales, offsets
            )
            self._cached = (key, weight)
        return self._cached[1]


class QuantizedLinear(_HoldsQuantized):
    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight)
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features)  # [rows, in]
        return quantized_matmul(flat, self.qweight, self.bias).view(*lead, self.out_features)

    def extra_repr(self) -> str:
        w = self.qweight
        return f"in_features={self.in_features}, out_features={self.out_features}, {w.scheme}"


class QuantizedEmbedding(_HoldsQuantized):
    """An embedding table held quantized; a lookup dequantizes the rows it reads."""

    def __init__(self, weight: QuantizedWeight, dtype: torch.dtype) -> None:
        super().__init__(weight)
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [tokens] -> [tokens, dim]
        rows = self.qweight.rows(ids.reshape(-1))
        return rows.dequantize(self.dtype).view(*ids.shape, self.embedding_dim)


def quantized_matmul(
    x: torch.Tensor,  # [rows, in]
    weight: QuantizedWeight,  # [out, in]
    bias: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [rows, out] in x's dtype
    """The best kernel there is for this device; the dequantizing fallback warns once."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        from gpu.kernels.native import cpu_kernels

        kernels = cpu_kernels()
        if kernels is not None:
            return kernels.qlinear(x.contiguous(), weight, bias)
        _warn_once("cpu", "no native CPU kernels: quantized layers dequantize each call (slow)")
    elif x.device.type == "cuda":
        from gpu.quant import triton_linear

        if triton_linear.available():
            return triton_linear.triton_qlinear(x.contiguous(), weight, bias)
        _warn_once("cuda", "no Triton: quantized layers dequantize each call (slow)")
    return F.linear(x, weight.dequantize(x.dtype), None if bias is None else bias.to(x.dtype))


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)
