"""The native CPU backend: tokenmill's C kernels (`gpu/kernels/native.py`) for float32 CPU
models, and the one-call decode step as a whole-step fast path over the model's forward.

A decode-only step of at most `DecodeStep.max_rows` sequences of a model that
`tm_decode_step` implements (`native_decode_step.implements`) runs as one native call; every
other step runs the model's forward in `KernelOps`. Same arithmetic, so the same tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu.backends.backend import Backend
from gpu.backends.kernel_ops import KernelOps
from gpu.backends.metadata import ModelInputs
from gpu.backends.native_decode_step import DecodeStep, implements
from gpu.kernels.native import CpuKernels
from gpu.kv_pool import KVPool


class NativeBackend(Backend):
    name = "native-paged"
    in_place = True

    def __init__(
        self,
        model: Any,  # a model file's model; the one-call step reads a Llama's or Gemma's weights
        kv: KVPool,
        kernels: CpuKernels,
        device: torch.device,
        **options: Any,  # `Backend`'s keyword options
    ) -> None:
        super().__init__(model, kv, KernelOps(kernels), device, **options)
        self.kernels = kernels
        config = model.config
        self._one_call = implements(config)
        self.decode_step: DecodeStep | None = None  # built on first use

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [rows, vocab] float32
        tokens = inputs.input_ids.shape[0]
        decodes = inputs.attention.decodes_only
        if self._one_call and decodes == tokens:
            step = self.decode_step
            if step is None:
                model: Any = self.model  # a Llama, a Gemma or a GPT-2: `_one_call`
                step = self.decode_step = DecodeStep(model, self.kernels)
            if tokens <= step.max_rows:
                x = step.embed(inputs.input_ids, inputs.positions)  # [tokens, hidden]
                every = step(x, inputs.rope_rows, self.kv, inputs.attention)  # [tokens, vocab]
                # every decode samples, and the rows are listed in order: no copy of the logits
                # (12 MB at 64 rows) when they are all of them
                whole = inputs.logits_rows.shape[0] == tokens
                return every if whole else every[inputs.logits_rows]
        return self.run_model(inputs)
