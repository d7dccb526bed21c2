"""Gemma's RMSNorms in one pass of the backend's kernel, swapped in when the encoder is built.

`GemmaRMSNorm` in torch makes four passes over its input (square, mean, scale, weight); an
encoder step normalises every token of every input six times a layer, so on the CPU those
passes are a fair share of the step. The kernels' `rms_norm` does it in one, given the
weight as Gemma applies it (1 + w, held once here). The per-head q/k norms, over views of the
fused qkv, are copied into rows first. Same arithmetic up to float32 rounding (one reciprocal
square root, a different summation order). Other dtypes stay in torch.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu.kernels.step_kernels import StepKernels
from gpu.models.gemma import GemmaRMSNorm


class FusedGemmaRMSNorm(nn.Module):
    scale: torch.Tensor  # [size] 1 + w, float32

    def __init__(self, norm: GemmaRMSNorm, kernels: StepKernels) -> None:
        super().__init__()
        self.inner = norm
        self.kernels = kernels
        scale = (1.0 + norm.weight.detach().float()).contiguous()  # [size]
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., size]
        if x.dtype != torch.float32:
            out: torch.Tensor = self.inner(x)
            return out
        rows = x.reshape(-1, x.shape[-1]).contiguous()  # a copy where x is a view of heads
        return self.kernels.rms_norm(rows, self.scale, self.inner.eps).view(x.shape)


def fuse_norms(module: nn.Module, kernels: StepKernels) -> int:
    """Swap every `GemmaRMSNorm` of float32 `module` for its fused form; return how many."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, GemmaRMSNorm) and child.weight.dtype == torch.float32:
                setattr(parent, name, FusedGemmaRMSNorm(child, kernels))
                count += 1
    return count
