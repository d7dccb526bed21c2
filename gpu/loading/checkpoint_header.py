"""Sizes read from checkpoint files without loading their weights: a checkpoint's config (HF
folder or GGUF header), and a GGUF's weights as the engine would hold them. The memory
planner (`gpu/memory/`) takes these as values; reading files is the loading layer's."""

from __future__ import annotations

import functools
from pathlib import Path

from gpu.loading.gguf import read_gguf_config
from gpu.loading.gguf_reader import read_gguf
from gpu.loading.model_config import load_hf_config
from gpu.memory.model_sizes import dtype_bytes
from gpu.memory.quantized_sizes import GGUF_KEPT_BYTES_PER_WEIGHT
from gpu.model_config import ModelConfig


def read_config(path: Path) -> ModelConfig:
    """A checkpoint's config without reading its weights (HF folder or .gguf).

    Remembered per file version: a GGUF header parse costs seconds (its tokenizer arrays) and
    leaves heap behind, and swaps back and forth plan for the same files again and again.
    """
    path = Path(path).resolve()
    return _read_config(path, _version(path))


def _version(path: Path) -> tuple[int, int] | None:
    """A file's (mtime, size): the key a remembered header is kept under."""
    stat = path.stat() if path.exists() else None
    return (stat.st_mtime_ns, stat.st_size) if stat is not None else None


@functools.lru_cache(maxsize=16)
def _read_config(path: Path, _version: tuple[int, int] | None) -> ModelConfig:
    if path.is_file() and path.suffix == ".gguf":
        return read_gguf_config(path)
    return load_hf_config(path)


def gguf_kept_weights_bytes(path: Path, dtype_bytes: int) -> int:
    """A GGUF's weights as `auto` holds them: block types in their kernel formats, the other
    tensors (norms, F16/F32 matrices) in the compute dtype. Reads the header only."""
    total = 0.0
    for tensor in read_gguf(path).tensors:
        count = 1
        for dim in tensor.shape:
            count *= dim
        per_weight = GGUF_KEPT_BYTES_PER_WEIGHT.get(tensor.tensor_type.name)
        two_d = len(tensor.shape) == 2
        total += count * (per_weight if per_weight is not None and two_d else dtype_bytes)
    return int(total)


def planned_gguf_weights(path: Path, quantization: str, dtype_name: str) -> int | None:
    """`gguf_kept_weights_bytes` where the engine keeps a GGUF's blocks (`auto`); else None."""
    if quantization != "auto" or path.suffix != ".gguf":
        return None
    path = Path(path).resolve()
    return _kept_weights(path, _version(path), dtype_bytes(dtype_name))


@functools.lru_cache(maxsize=16)
def _kept_weights(path: Path, _version: tuple[int, int] | None, dtype_bytes: int) -> int:
    """Remembered per file version, as `read_config` is: a swap plans for the same files again."""
    return gguf_kept_weights_bytes(path, dtype_bytes)
