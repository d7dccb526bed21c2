"""How much memory an engine holds, and how much a model would need before it is loaded.

Used by the swap planner: both numbers are bytes of device memory (host memory on CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpu.block_allocator import blocks_for
from gpu.engine_config import EngineConfig
from gpu.memory.activation_reserve import activation_reserve_bytes
from gpu.memory.held_bytes import module_bytes
from gpu.memory.model_sizes import dtype_bytes, kv_bytes_per_token, weights_bytes
from gpu.model_config import ModelConfig


def engine_bytes(engine: Any) -> int:
    """Weights, buffers and KV pool of a built engine (0 for engines without tensors)."""
    model = getattr(engine.model, "module", None)
    total = 0 if model is None else module_bytes(model)
    kv = getattr(engine, "kv", None)
    if kv is not None:
        total += kv.cache.numel() * kv.cache.element_size()
        total += kv.work.numel() * kv.work.element_size()
    return total


def planned_engine_bytes(
    config: ModelConfig,
    engine: EngineConfig,
    dtype: torch.dtype,
    max_model_len: int,
    packed: bool = False,
    quantization: str = "none",
    gguf_weights: int | None = None,
) -> int:
    """What an engine for `config` would hold: weights, a full KV pool and its workspace,
    and the activation reserve of one step. `packed`: its linear weights will be held a
    second time, packed for oneDNN (float32 on CPU; `gpu/models/packed_linear.py`).
    `quantization`: the engine's (`gpu.quant.scheme`); with `auto`, a GGUF's weights count as
    `gguf_weights` (`gpu.loading.checkpoint_header.planned_gguf_weights`: its blocks in the
    formats they load into). Packed copies are then not counted: the quantized layers are not
    packed (what stays float is, a small share)."""
    name = str(dtype).removeprefix("torch.")
    per_token = kv_bytes_per_token(config, name)
    blocks = engine.max_num_seqs * blocks_for(max_model_len, engine.block_size)
    if engine.num_kv_blocks is not None:
        blocks = min(blocks, engine.num_kv_blocks)
    kv = blocks * engine.block_size * per_token
    workspace = kv // max(config.num_layers, 1)
    reserve = activation_reserve_bytes(
        config,
        name,
        max_batched_tokens=engine.max_num_batched_tokens,
        max_batch=engine.max_num_seqs,
        max_context_len=max_model_len,
    )
    if quantization == "auto" and gguf_weights is not None:
        return gguf_weights + kv + workspace + reserve
    if quantization not in ("none", "auto"):
        return weights_bytes(config, name, quantization) + kv + workspace + reserve
    weights = config.num_parameters() * dtype_bytes(name)
    if packed:  # every linear: the parameters but the embedding table, unless it is the head
        untied_table = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
        weights += (config.num_parameters() - untied_table) * dtype_bytes(name)
    return weights + kv + workspace + reserve


def free_bytes(device: torch.device) -> int:
    """Memory free for a new model now: CUDA's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        torch.cuda.empty_cache()  # blocks cached by PyTorch but unused are free to a new model
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
