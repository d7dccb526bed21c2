"""Which backend an engine runs on, chosen once from the model's device and dtype and the
engine's configuration."""

from __future__ import annotations

import importlib

import torch

from gpu.backends.backend import Backend, StaticDecodes
from gpu.backends.native import NativeBackend
from gpu.backends.torch_backend import TorchBackend
from gpu.backends.triton import TritonBackend
from gpu.engine_config import EngineConfig
from gpu.kernels.native import CpuKernels, cpu_kernels
from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import KVPool
from gpu.loading.loader import LoadedModel


def step_kernels(model: LoadedModel, config: EngineConfig) -> StepKernels | None:
    """The kernel library the model's steps use: tokenmill's native kernels on float32 CPU
    models (where a C compiler builds them), Triton's on CUDA (where Triton imports); None:
    PyTorch's ops, with attention over gathered blocks."""
    if not config.native_kernels:
        return None
    if model.device.type == "cpu":
        return cpu_kernels() if model.dtype == torch.float32 else None
    from gpu.kernels.triton.kernels import triton_kernels

    return triton_kernels()


def static_decodes(config: EngineConfig, model: LoadedModel) -> bool:
    """Whether decode-only steps take the static path (`EngineConfig.decode_graphs`). Not
    captured for sparse-MoE models: their routing reads expert counts back each layer."""
    if config.decode_graphs == "auto":
        return model.device.type == "cuda" and not model.config.num_experts
    return config.decode_graphs == "eager"


def build_backend(
    model: LoadedModel,
    kv: KVPool,
    config: EngineConfig,
    *,
    window: int | None,
    long_rope: tuple[int, int] | None,
    max_blocks: int,
) -> Backend:
    """The backend for `model`: native on float32 CPU models, Triton on CUDA, else torch.
    `window`: the model's sliding window, if some layers have one; `max_blocks`: the widest
    block table (a sequence of max_model_len)."""
    kernels = step_kernels(model, config)
    if model.device.type == "cuda":  # SDPA's CausalBias: imported now (it imports
        importlib.import_module("torch.nn.attention.bias")  # torch._dynamo, ~3 s), not
        # at the first prefill over a cached context (`sdpa_attention._lower_right`)
    options: dict[str, object] = {"seed": config.seed, "window": window, "long_rope": long_rope}
    options["eos_token_ids"] = model.eos_token_ids  # what min_tokens bans
    if kernels is None:
        return TorchBackend(model.module, kv, model.device, **options)
    if static_decodes(config, model):
        options["static_decodes"] = StaticDecodes(config.max_num_seqs, max_blocks)
    if isinstance(kernels, CpuKernels):
        return NativeBackend(model.module, kv, kernels, model.device, **options)
    return TritonBackend(model.module, kv, kernels, model.device, **options)
