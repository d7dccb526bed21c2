"""What a model's parts take in bytes at a dtype: an element of each dtype name the planner
accepts, one token's K and V in every layer, and the weights (held as floats or quantized).

Pure arithmetic on a `ModelConfig` (no torch, no I/O).
"""

from __future__ import annotations

from types import MappingProxyType

from gpu.model_config import ModelConfig

DTYPE_BYTES: MappingProxyType[str, int] = MappingProxyType(
    {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
)
_CANONICAL_DTYPE = MappingProxyType({"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"})


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name (`float32`/`fp32`, `bfloat16`/`bf16`, `float16`/`fp16`)."""
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name!r}; choose one of: {', '.join(DTYPE_BYTES)}"
        ) from None


def canonical_dtype(name: str) -> str:
    """`bf16` → `bfloat16` and so on; raises ValueError like `dtype_bytes`."""
    dtype_bytes(name)
    key = name.lower()
    return _CANONICAL_DTYPE.get(key, key)


def kv_bytes_per_token(config: ModelConfig, dtype: str) -> int:
    """K and V for one token in every layer: 2 × layers × kv_heads × head_dim × dtype bytes."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)


def weights_bytes(config: ModelConfig, dtype: str, quantization: str = "none") -> int:
    """All parameters held in `dtype`: `config.num_parameters()` × dtype bytes; with
    `quantization` int8 or int4[-gN] the linear layers held quantized instead
    (`gpu.memory.quantized_sizes`). `none` and `auto` count floats: what `auto` keeps depends
    on the file (`gpu.loading.checkpoint_header.gguf_kept_weights_bytes`)."""
    method, _, group = quantization.partition("-g")
    if method in ("int8", "int4"):
        from gpu.memory.quantized_sizes import quantized_weights_bytes

        return quantized_weights_bytes(
            config, dtype_bytes(dtype), method, int(group) if group else None
        )
    return config.num_parameters() * dtype_bytes(dtype)
