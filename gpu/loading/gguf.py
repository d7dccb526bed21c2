"""Reading a GGUF file (llama.cpp's single-file format) into a `Checkpoint`.

Metadata becomes a `ModelConfig` (`gguf_config.py`); each tensor is offered under its Hugging
Face name and `[out_features, in_features]` layout (`gguf_tensors.py`), and dequantized
(`gpu.loading.gguf_quants`) only when the model reads it, straight to the model's dtype: loading
holds the final weights and one tensor in flight, never the whole model in float32.
`GGUFTensors.quantized` hands a block-quantized weight out as a `QuantizedWeight` instead, with
no float copy at all. The tokenizer is rebuilt from `tokenizer.ggml.*` by
`gpu.loading.gguf_tokenizer`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpu.errors import CheckpointError
from gpu.loading.checkpoint import Checkpoint
from gpu.loading.gguf_config import GGUFMeta, config_from_gguf
from gpu.loading.gguf_reader import GGUFFormatError, GGUFHeader, read_gguf
from gpu.loading.gguf_tensors import GGUFTensors
from gpu.loading.gguf_tokenizer import build_gguf_tokenizer
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import ModelConfig


def read_gguf_config(path: Path) -> ModelConfig:
    """The model's shapes from the file's metadata alone; no tensor data is read."""
    path = Path(path)
    return config_from_gguf(_open(path), path)


def read_gguf_header(path: Path) -> tuple[ModelConfig, Tokenizer, int]:
    """Config, tokenizer and the header's size in bytes, from one parse of the metadata.

    No tensor data is read (the benchmark's echo engine needs no weights).
    """
    path = Path(path)
    header = _open(path)
    config = config_from_gguf(header, path)
    tokenizer = build_gguf_tokenizer(GGUFMeta(header, path), config)
    return config, tokenizer, int(header.data_offset)


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Config, weights under HF names (dequantized to `dtype` as each is read), and tokenizer.

    Every tensor's name and shape is checked here; the data is read when the model takes it.
    """
    path = Path(path)
    header = _open(path)
    config = config_from_gguf(header, path)
    tensors = GGUFTensors(header, config, path, dtype)
    tokenizer = build_gguf_tokenizer(GGUFMeta(header, path), config)
    return Checkpoint(config=config, tensors=tensors, tokenizer=tokenizer, files=[path])


def _open(path: Path) -> GGUFHeader:
    if not path.is_file():
        raise CheckpointError(path, "no such file")
    try:
        return read_gguf(path)
    except (GGUFFormatError, OSError) as exc:
        raise CheckpointError(
            path,
            f"not a readable GGUF file ({path.stat().st_size} bytes; truncated or corrupt?): {exc}",
        ) from exc
