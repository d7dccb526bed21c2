"""Reading checkpoints: an HF folder of safetensors or a single GGUF file.

A `Checkpoint` is the config, every weight under its Hugging Face name, the tokenizer and the
files read. Weights are read one at a time, as the model takes them: safetensors as views of
the file's memory map, in the file's dtype, which the model copies into its parameters in its
compute dtype (the map is dropped with the view, so its pages leave the process too); GGUF
tensors dequantized to the dtype `load_gguf` is given. Loading holds the final weights and one
tensor in flight, never the whole checkpoint. `load_hf_folder` reads an HF folder here,
`gpu.loading.gguf.load_gguf` a GGUF file; `gpu.loading.loader.load_checkpoint` picks between
them.
Only safetensors and GGUF are read; no pickle ever touches a model file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from gpu.errors import CheckpointError
from gpu.loading.model_config import load_hf_config
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import ModelConfig


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
    check_recorded_sha256(path, files)
    tensors: Mapping[str, torch.Tensor] = SafetensorsTensors(files)
    if BARE_EMBEDDING in tensors and "model." + BARE_EMBEDDING not in tensors:
        tensors = Prefixed(tensors, "model.")  # a bare model's weights (no LM head)
    tokenizer = Tokenizer.from_hf_folder(path, eos_token_ids=config.eos_token_ids)
    return Checkpoint(config=config, tensors=tensors, tokenizer=tokenizer, files=files)


def check_recorded_sha256(folder: Path, files: list[Path]) -> None:
    """A folder `tokenmill quantize` wrote (config.json's `quantization_config.quant_method` is
    "tokenmill") records the sha256 of its weight files: each must still match, or the folder
    is refused before any weight is used. Other folders pass unread.

    Hashing reads every byte of the weights once more (the content digest reads them too):
    well under a second for the checkpoints tokenmill quantize writes (135 MB for SmolLM2-135M
    in int8), a few seconds per GB, against a load that maps them anyway.
    """
    config_path = folder / "config.json"
    try:
        quant = json.loads(config_path.read_text()).get("quantization_config")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise CheckpointError(config_path, f"cannot parse config.json: {exc}") from exc
    if not isinstance(quant, dict) or quant.get("quant_method") != "tokenmill":
        return
    recorded = quant.get("sha256")
    if not isinstance(recorded, dict) or not recorded:
        raise CheckpointError(
            config_path, "quantization_config records no sha256 of the weight files"
        )
    for file in files:
        digest = recorded.get(file.name)
        if digest is None:
            raise CheckpointError(
                file, "weight file not listed in config.json's quantization_config.sha256"
            )
        if file_sha256(file) != digest:
            raise CheckpointError(
                file,
                f"{file.name} does not match the sha256 its config.json records: the checkpoint "
                "was changed after tokenmill quantize wrote it (re-run tokenmill quantize)",
            )


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


class SafetensorsTensors(Mapping[str, torch.Tensor]):
    """The tensors of one or more safetensors files; each is read when the model takes it.

    Every file's header is read (and checked against the file's size) up front. Reading a name
    maps its file and returns the tensor as a view of the map: nothing is copied until the
    model copies it into its parameter, and the map goes when the view does.
    """

    def __init__(self, files: list[Path]) -> None:
        self._file: dict[str, Path] = {}
        for file in files:
            with _opened(file) as f:
                self._file.update(dict.fromkeys(f.keys(), file))

    def __contains__(self, name: object) -> bool:
        return name in self._file

    def __iter__(self) -> Iterator[str]:
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._file[name]
        with _opened(file) as f:
            try:
                tensor: torch.Tensor = f.get_tensor(name)
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(file, f"corrupt safetensors tensor {name!r}: {exc}") from exc
        return tensor


BARE_EMBEDDING = "embed_tokens.weight"  # a `*Model` (`Gemma3TextModel`) saves names bare


class Prefixed(Mapping[str, torch.Tensor]):
    """A bare model's tensors (`embed_tokens.weight`, `layers.0...`: what transformers saves of
    a `Gemma3TextModel`, the body of a sentence-transformers folder) under the names a
    `*ForCausalLM` gives them (`model.embed_tokens.weight`), which the model files take."""

    def __init__(self, inner: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix

    def __contains__(self, name: object) -> bool:
        return (
            isinstance(name, str)
            and name.startswith(self.prefix)
            and (name.removeprefix(self.prefix) in self.inner)
        )

    def __iter__(self) -> Iterator[str]:
        return (self.prefix + name for name in self.inner)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, name: str) -> torch.Tensor:
        if not name.startswith(self.prefix):
            raise KeyError(name)
        return self.inner[name.removeprefix(self.prefix)]


def _opened(file: Path):  # type: ignore[no-untyped-def]  # safetensors' handle is untyped
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(file, f"corrupt or truncated safetensors file: {exc}") from exc


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
