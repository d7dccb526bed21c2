"""The texts `tokenmill bench embed` embeds: seeded, of mixed lengths, from real prose.

Each text is a run of consecutive words of the project's sample prose (`ops/samples/`),
starting at a sentence, of a length drawn from one of four kinds: a short sentence, a
paragraph, a long passage and a document over 512 tokens (more words than that, and every
word is at least one token). No torch, no tokenizer: the same seed gives the same texts on
every machine.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CORPUS_FILES = ("heldout.txt", "calibration.txt")


@dataclass(frozen=True)
class TextKind:
    name: str
    share: float  # of the texts
    min_words: int
    max_words: int


KINDS = (
    TextKind("sentence", 0.45, 5, 30),
    TextKind("paragraph", 0.35, 40, 200),
    TextKind("passage", 0.15, 200, 400),
    TextKind("document", 0.05, 520, 800),  # > 512 tokens whatever the tokenizer
)


@dataclass(frozen=True)
class BenchText:
    kind: str
    text: str

    @property
    def words(self) -> int:
        return len(self.text.split())


def corpus_words(files: Sequence[Path] | None = None) -> tuple[list[str], list[int]]:
    """The sample prose as one stream of words, and the indices where sentences start."""
    words: list[str] = []
    starts: list[int] = []
    for path in files or [SAMPLES / name for name in CORPUS_FILES]:
        for sentence in re.split(r"(?<=[.!?])\s+", path.read_text()):
            if len(sentence.split()) >= 3:  # not a heading's stray word
                starts.append(len(words))
                words.extend(sentence.split())
    return words, starts


def make_texts(count: int, seed: int = 0, words: tuple[list[str], list[int]] | None = None) -> (
    list[BenchText]
):  # fmt: skip
    """`count` texts, their kinds in the shares of `KINDS` (shuffled), seeded."""
    stream, starts = words or corpus_words()
    rng = random.Random(seed)
    kinds = [kind for kind in KINDS for _ in range(round(kind.share * count))]
    kinds = (kinds + [KINDS[0]] * count)[:count]  # rounding: pad with sentences
    rng.shuffle(kinds)
    texts = []
    for kind in kinds:
        length = rng.randint(kind.min_words, kind.max_words)
        start = rng.choice(starts)
        picked = [stream[(start + i) % len(stream)] for i in range(length)]  # wraps around
        texts.append(BenchText(kind.name, " ".join(picked)))
    return texts


def describe(
    texts: Sequence[BenchText], token_counts: Sequence[int] | None = None
) -> dict[str, Any]:
    """How many of each kind, and their words (and tokens, when counted)."""
    kinds: dict[str, dict[str, int]] = {}
    for i, text in enumerate(texts):
        entry = kinds.setdefault(text.kind, {"texts": 0, "words": 0, "max_words": 0})
        entry["texts"] += 1
        entry["words"] += text.words
        entry["max_words"] = max(entry["max_words"], text.words)
        if token_counts is not None:
            entry["tokens"] = entry.get("tokens", 0) + token_counts[i]
            entry["max_tokens"] = max(entry.get("max_tokens", 0), token_counts[i])
    summary: dict[str, Any] = {
        "texts": len(texts),
        "words": sum(t.words for t in texts),
        "kinds": kinds,
    }
    if token_counts is not None:
        summary["tokens"] = sum(token_counts)
        summary["over_512_tokens"] = sum(1 for n in token_counts if n > 512)
    return summary
