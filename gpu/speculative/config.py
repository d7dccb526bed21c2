"""What a worker speculates with: parsed from `--speculative` and `--speculative-model`.

    --speculative ngram                 prompt lookup, k = 4 tokens, n-grams of 3 down to 1
    --speculative ngram:k=6,n=2-4       k = 6, n-grams of 4 down to 2
    --speculative-model M [--speculative-k K]   a draft model (same tokenizer), K tokens

Plain values, no torch: the CLI checks a flag before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpu.errors import SpeculativeConfigError

MAX_K = 16  # proposed tokens per step and sequence
DEFAULT_K = 4
NGRAM_MIN, NGRAM_MAX = 1, 3  # default n-gram sizes, longest tried first
NGRAM_LIMIT = 8  # the largest n accepted

ProposerKind = Literal["ngram", "draft"]


@dataclass(frozen=True)
class SpeculativeConfig:
    kind: ProposerKind
    k: int = DEFAULT_K  # tokens proposed per sequence and step, at most
    ngram_min: int = NGRAM_MIN
    ngram_max: int = NGRAM_MAX
    model: str | None = None  # the draft model's name or path (kind "draft")

    def __post_init__(self) -> None:
        if not 1 <= self.k <= MAX_K:
            raise SpeculativeConfigError(f"k must be 1..{MAX_K}, got {self.k}")
        if not 1 <= self.ngram_min <= self.ngram_max <= NGRAM_LIMIT:
            raise SpeculativeConfigError(
                f"n must be a range within 1..{NGRAM_LIMIT}, got {self.ngram_min}-{self.ngram_max}"
            )
        if (self.kind == "draft") != (self.model is not None):
            raise SpeculativeConfigError("a draft model proposer needs a model, and only it")

    @classmethod
    def parse(
        cls, spec: str | None, model: str | None = None, k: int | None = None
    ) -> SpeculativeConfig | None:
        """From the flags' values; None when neither asks for speculation. Raises
        `SpeculativeConfigError` naming what is wrong."""
        if spec and model:
            raise SpeculativeConfigError("--speculative and --speculative-model exclude each other")
        if model:
            return cls("draft", k=DEFAULT_K if k is None else k, model=model)
        if not spec:
            if k is not None:
                raise SpeculativeConfigError("--speculative-k needs --speculative-model")
            return None
        name, _, rest = spec.partition(":")
        if name.strip() != "ngram":
            raise SpeculativeConfigError(
                f"unknown proposer {name!r}: use ngram[:k=..,n=MIN-MAX], or --speculative-model"
            )
        values = {
            "k": DEFAULT_K if k is None else k,
            "ngram_min": NGRAM_MIN,
            "ngram_max": NGRAM_MAX,
        }
        for part in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = part.partition("=")
            try:
                if key == "k" and eq:
                    values["k"] = int(value)
                elif key == "n" and eq:
                    low, dash, high = value.partition("-")
                    values["ngram_min"] = int(low)
                    values["ngram_max"] = int(high) if dash else int(low)
                else:
                    raise ValueError(part)
            except ValueError:
                raise SpeculativeConfigError(
                    f"bad --speculative option {part!r}: expected k=INT or n=MIN-MAX"
                ) from None
        return cls(
            "ngram", k=values["k"], ngram_min=values["ngram_min"], ngram_max=values["ngram_max"]
        )

    def describe(self) -> str:
        """As the flag spells it (logs, bench reports)."""
        if self.kind == "draft":
            return f"draft:{self.model}:k={self.k}"
        return f"ngram:k={self.k},n={self.ngram_min}-{self.ngram_max}"
