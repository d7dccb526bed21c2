"""What `--quantization` asks for, and the name a loaded model's weights go by.

- `none`: every weight in the compute dtype (a GGUF's blocks are dequantized, as they always were);
- `auto`: a GGUF's quantized tensors stay quantized, in the nearest kernel format
  (`gpu.loading.gguf_quants.to_quantized`), and a checkpoint written by `tokenmill quantize`
  loads as it was written; float weights stay float;
- `int8`: linear weights quantized at load, symmetric, one scale per output channel;
- `int4`, `int4-g32`, `int4-g128`: asymmetric 4-bit in groups of 32 (the default) or 128 input
  features.
`int8` and `int4` quantize the float weights a checkpoint gives (a GGUF's dequantized blocks),
so they mean the same on any source; only `auto` keeps a file's own quantization.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from gpu.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8

CHOICES = ("none", "auto", "int8", "int4", "int4-g32", "int4-g128")


@dataclass(frozen=True)
class Quantization:
    method: str = "none"  # none | auto | int8 | int4
    group: int | None = None  # int4: 32 or 128; int8: None (per output channel)

    @classmethod
    def parse(cls, text: str | Quantization | None) -> Quantization:
        """`--quantization`'s value; ValueError naming the choices for anything else."""
        if isinstance(text, Quantization):
            return text
        name = (text or "none").strip().lower()
        if name not in CHOICES:
            raise ValueError(f"unknown quantization {text!r}: expected one of {', '.join(CHOICES)}")
        if name.startswith("int4"):
            return cls("int4", 128 if name.endswith("g128") else 32)
        return cls(name)

    @property
    def name(self) -> str:
        return f"int4-g{self.group}" if self.method == "int4" else self.method

    @property
    def keeps_file_quantization(self) -> bool:
        """Whether a GGUF's quantized tensors (or a quantized checkpoint's) stay quantized."""
        return self.method == "auto"

    @property
    def quantizes_floats(self) -> bool:
        return self.method in ("int8", "int4")

    def quantize(self, weight: torch.Tensor) -> QuantizedWeight:  # [out, in]
        if self.method == "int8":
            return quantize_int8(weight)
        if self.method == "int4":
            return quantize_int4(weight, self.group_for(weight.shape[1]))
        raise ValueError(f"quantization {self.name!r} does not quantize weights")

    def group_for(self, in_features: int) -> int:
        """int4's group for a layer: the scheme's, or where that does not divide the input
        features (SmolLM2's 576 and g128), the largest power of two below it that does."""
        group = self.group or 32
        while group > 32 and in_features % group:
            group //= 2
        return group

    def fits(self, in_features: int) -> bool:
        """Whether a layer with `in_features` inputs can take this scheme (kernels need
        multiples of 16, int4 whole groups of at least 32)."""
        if in_features % 16:
            return False
        return self.method != "int4" or in_features % self.group_for(in_features) == 0


def describe(module: nn.Module, dtype: torch.dtype) -> str:
    """The formats of a model's linear weights, by share of their elements: `int4-g32`, or
    `int4-g32+int8-g32+float32` when they are mixed; `none` when nothing is quantized."""
    from gpu.models.moe import StackedExperts
    from gpu.quant.linear import QuantizedLinear

    share: Counter[str] = Counter()
    seen: set[int] = set()
    for m in module.modules():
        if isinstance(m, QuantizedLinear):
            w = m.qweight
            if w.data.data_ptr() not in seen:
                seen.add(w.data.data_ptr())
                share[w.scheme] += w.out_features * w.in_features
        elif isinstance(m, (nn.Linear, StackedExperts)) or hasattr(m, "packed"):
            weight: torch.Tensor = m.weight  # type: ignore[assignment]  # Linear, experts, packed
            if weight.data_ptr() not in seen:
                seen.add(weight.data_ptr())
                share[str(dtype).removeprefix("torch.")] += weight.numel()
    quantized = [s for s in share if s.startswith("int")]
    if not quantized:
        return "none"
    return "+".join(s for s, _ in share.most_common())
