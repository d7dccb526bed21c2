"""The sampling values a model's authors recommend: what an omitted `temperature`, `top_p` or
`top_k` means for a request that asks for the model's defaults (`GenerateRequest.model_defaults`).

An HF folder says them in `generation_config.json`; a GGUF file in its `general.sampling.temp`,
`general.sampling.top_p` and `general.sampling.top_k` metadata. A value the model does not give
is None: the caller falls back to OpenAI's (1.0, 1.0, off).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpu.loading.gguf_reader import GGUFFormatError, read_gguf

_GGUF_KEYS = {
    "temperature": "general.sampling.temp",
    "top_p": "general.sampling.top_p",
    "top_k": "general.sampling.top_k",
}


@dataclass(frozen=True)
class SamplingDefaults:
    """The model's recommended values; None where it recommends none."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    @classmethod
    def of(cls, values: dict[str, Any]) -> SamplingDefaults:
        """From `{temperature, top_p, top_k}`-keyed values; a missing or malformed one is None
        (a bad recommendation must not make a model unservable)."""
        return cls(
            temperature=_number(values.get("temperature")),
            top_p=_number(values.get("top_p")),
            top_k=_count(values.get("top_k")),
        )


@lru_cache(maxsize=8)
def read_sampling_defaults(path: Path) -> SamplingDefaults:
    """`path`'s recommended sampling (an HF folder or a `.gguf` file); none for anything else
    or a file that cannot be read (loading the model reports that)."""
    path = Path(path)
    if path.is_dir():
        config = path / "generation_config.json"
        try:
            raw = json.loads(config.read_text()) if config.is_file() else {}
        except (OSError, json.JSONDecodeError):
            return SamplingDefaults()
        return SamplingDefaults.of(raw if isinstance(raw, dict) else {})
    if path.is_file() and path.suffix == ".gguf":
        try:
            fields = read_gguf(path).fields
        except (GGUFFormatError, OSError):
            return SamplingDefaults()
        return SamplingDefaults.of({name: fields.get(key) for name, key in _GGUF_KEYS.items()})
    return SamplingDefaults()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value
