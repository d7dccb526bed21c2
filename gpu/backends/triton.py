"""The Triton backend (CUDA; the CPU through Triton's interpreter in tests): `KernelOps` over
`TritonKernels` (fused rotary + K/V write, decode and prefill attention in the pool), and the
static decode path captured as CUDA graphs."""

from __future__ import annotations

from typing import Any

import torch

from gpu.backends.backend import Backend, CausalLM
from gpu.backends.kernel_ops import KernelOps
from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import KVPool


class TritonBackend(Backend):
    name = "triton-paged"
    in_place = True

    def __init__(
        self,
        model: CausalLM,
        kv: KVPool,
        kernels: StepKernels,
        device: torch.device,
        **options: Any,
    ) -> None:
        super().__init__(model, kv, KernelOps(kernels), device, **options)
        self.kernels = kernels
