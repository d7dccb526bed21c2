"""How the engine sizes its KV pool: the bytes a device budget leaves after the weights and
the activation reserve, and how many blocks fit in them.

    kv_budget = kv_budget_bytes(config, dtype=..., device_budget_bytes=..., ...)
    num_blocks = num_kv_blocks(config, dtype=..., kv_budget_bytes=kv_budget, block_size=16)

Pure arithmetic on a `ModelConfig` (no torch, no I/O); every quantity is in bytes.
"""

from __future__ import annotations

from gpu.errors import MemoryPlanError
from gpu.memory.activation_reserve import activation_reserve_bytes
from gpu.memory.byte_sizes import format_bytes
from gpu.memory.model_sizes import kv_bytes_per_token, weights_bytes
from gpu.model_config import ModelConfig


def num_kv_blocks(config: ModelConfig, *, dtype: str, kv_budget_bytes: int, block_size: int) -> int:
    """How many KV blocks of `block_size` tokens fit in `kv_budget_bytes` (floor)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if kv_budget_bytes <= 0:
        return 0
    return kv_budget_bytes // (block_size * kv_bytes_per_token(config, dtype))


def kv_budget_bytes(
    config: ModelConfig,
    *,
    dtype: str,
    device_budget_bytes: int,
    max_batched_tokens: int,
    max_batch: int,
    max_context_len: int | None = None,
    weights: int | None = None,
) -> int:
    """Bytes left for the KV pool after the weights and the activation reserve.

    `max_context_len` is the engine's longest sequence (default: the model's
    max_position_embeddings); see `activation_reserve_bytes`. `weights`: what the loaded
    weights really hold (a quantized model), instead of the parameters in `dtype`. Raises
    `MemoryPlanError` (with the numbers) when nothing is left.
    """
    weights = weights_bytes(config, dtype) if weights is None else weights
    reserve = activation_reserve_bytes(
        config, dtype, max_batched_tokens, max_batch, max_context_len=max_context_len
    )
    left = device_budget_bytes - weights - reserve
    if left <= 0:
        raise MemoryPlanError(
            f"no memory left for the KV cache: device budget {format_bytes(device_budget_bytes)}"
            f" ({device_budget_bytes} B) − weights {format_bytes(weights)} ({weights} B, "
            f"{dtype}) − activation reserve {format_bytes(reserve)} ({reserve} B, "
            f"max_batched_tokens={max_batched_tokens}, max_batch={max_batch}) = {left} B"
        )
    return left
