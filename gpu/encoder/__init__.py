"""The encoder path: embedding models run bidirectionally over whole inputs, no KV kept.

    is_embedding_model(path)        a sentence-transformers folder that pools (`pipeline`)
    load_encoder_engine(path, ...)  its `EncoderEngine` (`engine`)
    inputs.embed_tokens / fit       an input's tokens, as sentence-transformers makes them

The engine is imported on first use: `gpu.encoder.spec` and `inputs` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu.encoder.engine import EncoderEngine, load_encoder_engine
    from gpu.encoder.pipeline import is_embedding_model

__all__ = ["EncoderEngine", "is_embedding_model", "load_encoder_engine"]


def __getattr__(name: str) -> Any:
    if name in ("EncoderEngine", "load_encoder_engine"):
        from gpu.encoder import engine

        return getattr(engine, name)
    if name == "is_embedding_model":
        from gpu.encoder.pipeline import is_embedding_model

        return is_embedding_model
    raise AttributeError(f"module 'gpu.encoder' has no attribute {name!r}")
