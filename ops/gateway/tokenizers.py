"""The tokenizers of the fleet's models, as this host has them, for `/tokenize` and
`/detokenize`: the gateway holds no model, so each is read from the model's files when they
are here (a registry alias fetched into the cache, or the path a worker was given), never
downloaded, and kept once read.

Only the tokenizer is read: a GGUF file's metadata, or an HF folder's `tokenizer.json` and
configs. `gpu.loading`'s readers of those import no torch.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpu.errors import CheckpointError
from gpu.loading.gguf_config import GGUFMeta, config_from_gguf
from gpu.loading.gguf_reader import GGUFFormatError, read_gguf
from gpu.loading.gguf_tokenizer import build_gguf_tokenizer
from gpu.loading.model_config import load_hf_config
from gpu.loading.tokenizer import Tokenizer
from ops.gateway.errors import tokenizer_unavailable
from ops.models.registry import REGISTRY, is_cached, model_path


class LocalTokenizers:
    """Each model's tokenizer, read once (`get`), by the name the fleet lists it under."""

    def __init__(self) -> None:
        self._read: dict[str, asyncio.Future[Tokenizer]] = {}

    async def get(self, model: str) -> Tokenizer:
        """`model`'s tokenizer; `ApiError` 503 `tokenizer_unavailable` when its files are not
        on this host or cannot be read."""
        reading = self._read.get(model)
        if reading is None or (reading.done() and reading.exception() is not None):
            reading = asyncio.ensure_future(asyncio.to_thread(read_tokenizer, model))
            self._read[model] = reading
        return await asyncio.shield(reading)


def read_tokenizer(model: str) -> Tokenizer:
    """The tokenizer in `model`'s files on this host (a registry alias, or a path)."""
    path = local_path(model)
    try:
        if path.is_dir():
            return Tokenizer.from_hf_folder(path, load_hf_config(path).eos_token_ids)
        header = read_gguf(path)
        return build_gguf_tokenizer(GGUFMeta(header, path), config_from_gguf(header, path))
    except (CheckpointError, GGUFFormatError, OSError, ValueError) as exc:
        raise tokenizer_unavailable(model, f"its files cannot be read: {exc}") from None


def local_path(model: str) -> Path:
    """Where `model`'s files are on this host; `ApiError` 503 when they are not here."""
    if model in REGISTRY:
        if not is_cached(model):
            raise tokenizer_unavailable(
                model, f"not fetched here: `tokenmill models fetch {model}`"
            )
        return model_path(model)
    path = Path(model).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path
    raise tokenizer_unavailable(model, "no such alias or path on this host")
