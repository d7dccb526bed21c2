"""`EmbeddingSpec`: what the rest of tokenmill needs to know of an embedding model.

The ingest reads it (through the engine's `embedding` attribute) to tokenize and check an
`EmbedRequest`; the gateway's model list learns from the worker's events that the model embeds.
A generative engine's `embedding` is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EmbeddingSpec:
    dimensions: int  # the vectors' full width (the pipeline's last output)
    max_tokens: int  # the longest input it takes, special tokens included
    prompts: Mapping[str, str] = field(default_factory=dict)  # task prompts by name
    default_prompt_name: str | None = None  # applied when a request names none
    pooling: str = "mean"  # sentence-transformers' pooling mode
    normalized: bool = True  # vectors have unit length (a Normalize module ends the pipeline)
    # special tokens the tokenizer puts before and after a text (<bos>, <eos>): truncation
    # keeps them (`gpu.encoder.inputs.fit`)
    specials: tuple[int, int] = (1, 1)
