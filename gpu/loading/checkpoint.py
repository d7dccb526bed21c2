"""Reading checkpoints: an HF folder of safetensors or a single GGUF file.

A `Checkpoint` is the config, every weight under its Hugging Face name (on the host: safetensors
in the file's dtype, which the model casts to its compute dtype as it loads them; GGUF tensors
dequantized one at a time, to the dtype `load_gguf` is given, as the model reads them), the
tokenizer and the files read. `load_hf_folder` reads an HF folder here, `gpu.loading.gguf.load_gguf`
a GGUF file; `gpu.loading.loader.load_checkpoint` picks between them.
Only safetensors and GGUF are read; no pickle ever touches a model file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from gpu.errors import CheckpointError
from gpu.loading.model_config import ModelConfig, load_hf_config
from gpu.loading.tokenizer import Tokenizer


@dataclass
class Checkpoint:
    """Everything needed to build a model, as read from disk."""

    config: ModelConfig
    tensors: Mapping[str, torch.Tensor]  # Hugging Face parameter names
    tokenizer: Tokenizer
    files: list[Path]  # the weight files, for the content digest


def load_hf_folder(path: Path) -> Checkpoint:
    """Load an HF folder: `config.json`, `*.safetensors` (sharded or not), `tokenizer.json`."""
    config = load_hf_config(path)
    files = safetensors_files(path)
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file), device="cpu"))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(file, f"corrupt or truncated safetensors file: {exc}") from exc
    tokenizer = Tokenizer.from_hf_folder(path, eos_token_ids=config.eos_token_ids)
    return Checkpoint(config=config, tensors=tensors, tokenizer=tokenizer, files=files)


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of an HF folder: the sharded index's files, or `*.safetensors`."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(index, f"bad sharded index: {exc}") from exc
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise CheckpointError(
                    file, "shard listed in model.safetensors.index.json is missing"
                )
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
            raise CheckpointError(
                folder,
                "only pickle weights (*.bin/*.pt) found; tokenmill loads safetensors or GGUF",
            )
        raise CheckpointError(folder, "no *.safetensors weight files found")
    return files
