"""One product of every expert of a sparse MLP, held quantized: expert e's [out, in] matrix as
its own `QuantizedLinear` (int8 or int4, as `--quantization` asks).

    gate_up = QuantizedExperts.of(moe.gate_up.weight, scheme)   # stacked [experts, out, in]
    y = gate_up.product(expert, rows)                    # [rows, in] -> [rows, out]
    w = gate_up.matrix(expert)                           # its QuantizedWeight (the decode step's)

A sparse MLP's experts are most of its weights (Mixtral: 96% of them), loaded stacked in one
float tensor per product (`gpu.models.moe.StackedExperts`); `gpu.quant.apply.quantize_linears`
puts these in their place (the same `Experts` interface). Each expert's integers, scales and
offsets are buffers of its `QuantizedLinear`, so memory accounting and `state_dict()` see them.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu.quant.linear import QuantizedLinear
from gpu.quant.scheme import Quantization
from gpu.quantized_weight import QuantizedWeight


class QuantizedExperts(nn.Module):
    def __init__(self, experts: list[QuantizedLinear]) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)
        first = experts[0]
        self.num_experts = len(experts)
        self.in_features, self.out_features = first.in_features, first.out_features

    @classmethod
    def of(cls, stacked: torch.Tensor, scheme: Quantization) -> QuantizedExperts:
        """`stacked` [experts, out, in] (float), each expert's matrix quantized by `scheme`."""
        weights = stacked.detach()
        return cls([QuantizedLinear(scheme.quantize(w.contiguous())) for w in weights])

    def product(self, expert: int, rows: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        layer: QuantizedLinear = self.experts[expert]  # type: ignore[assignment]
        out: torch.Tensor = layer(rows)
        return out

    def matrix(self, expert: int) -> QuantizedWeight:
        layer: QuantizedLinear = self.experts[expert]  # type: ignore[assignment]
        return layer.qweight

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, in_features={self.in_features}, "
            f"out_features={self.out_features}, {self.matrix(0).scheme}"
        )
