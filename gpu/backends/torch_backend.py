"""The torch backend: PyTorch's ops alone (`TorchOps`), attention with SDPA over gathered
blocks. The reference every other backend matches, and the fallback wherever no kernel
library runs (CPU models in other dtypes, no C compiler, no Triton)."""

from __future__ import annotations

from typing import Any

import torch

from gpu.backends.backend import Backend, CausalLM
from gpu.backends.torch_ops import TorchOps
from gpu.kv_pool import KVPool


class TorchBackend(Backend):
    name = "sdpa-gather"
    in_place = False

    def __init__(self, model: CausalLM, kv: KVPool, device: torch.device, **options: Any) -> None:
        super().__init__(model, kv, TorchOps(), device, **options)
