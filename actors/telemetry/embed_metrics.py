"""Embedding's metrics: the vectors made and the tokens the encoder ran over.

Embeddings per second and embedded tokens per second are rates of the two counters
(docs/operations.md):

    rate(tokenmill_embeddings_total[1m])       # vectors/s
    rate(tokenmill_embedded_tokens_total[1m])  # tokens/s (task prompts and special tokens in)

Requests by outcome are `tokenmill_requests_total`'s, as for generation. A worker that serves
a generative model leaves both at 0.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from messages.embedding import EmbedResult


class EmbedMetrics:
    """The embedding series of one worker's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.embeddings = Counter(
            "tokenmill_embeddings", "Vectors made (one per input of an answered request).",
            registry=registry,
        )  # fmt: skip
        self.embedded_tokens = Counter(
            "tokenmill_embedded_tokens",
            "Tokens of the inputs embedded (task prompts and special tokens included, after "
            "truncation).",
            registry=registry,
        )

    def observe(self, result: EmbedResult) -> None:
        """An embedding request's result: its vectors and tokens, when it made them."""
        if result.data:
            self.embeddings.inc(len(result.data))
            self.embedded_tokens.inc(result.usage.prompt_tokens)
