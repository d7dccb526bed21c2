"""What `tokenmill bench embed` does with its contenders, whatever they are: time each on the same
texts in alternating rounds, pick sentence-transformers' best batch size, compare the vectors.

Torch-free and model-free, so the report's shape is unit-tested with fakes; the contenders
themselves (tokenmill's encoder, sentence-transformers, vLLM) are in `ops/bench/embed.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ops.bench.report import Narrate, alternate, ratio, significant


class Contender(Protocol):
    """One way of embedding texts: a name, and `embed` giving one row per text, in order."""

    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...  # [texts, dims] float32


@dataclass
class Timings:
    """A contender's timed runs over the same texts, and the vectors of its last run."""

    name: str
    seconds: list[float] = field(default_factory=list)
    vectors: np.ndarray | None = None

    def summary(self, texts: int, tokens: int) -> dict[str, Any]:
        runs = [
            {
                "seconds": round(s, 3),
                "texts_per_s": significant(texts / s),
                "tokens_per_s": significant(tokens / s),
            }
            for s in self.seconds
        ]
        best = min(self.seconds)
        return {
            "runs": runs,
            "texts_per_s": significant(texts / best),  # the best run
            "tokens_per_s": significant(tokens / best),
        }


def timed(contender: Contender, texts: Sequence[str]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    vectors = contender.embed(texts)
    return time.perf_counter() - start, vectors


def run_rounds(
    contenders: Sequence[Contender], texts: Sequence[str], rounds: int, say: Narrate
) -> dict[str, Timings]:
    """Each contender `rounds` times over `texts`, in the order a, b, b, a, … (so that none
    always goes first), after one untimed warm-up each on a few texts."""
    by_name = {c.name: c for c in contenders}
    for contender in contenders:
        contender.embed(texts[:4])
    timings = {name: Timings(name) for name in by_name}
    for i, name in enumerate(alternate(list(by_name), rounds)):
        seconds, vectors = timed(by_name[name], texts)
        if vectors.shape[0] != len(texts):
            raise RuntimeError(f"{name} gave {vectors.shape[0]} vectors for {len(texts)} texts")
        timings[name].seconds.append(seconds)
        timings[name].vectors = vectors
        say(f"run {i + 1}: {name} {seconds:.1f} s ({len(texts) / seconds:.1f} texts/s)")
    return timings


def best_batch_size(
    make: Callable[[int], Contender], sizes: Sequence[int], sample: Sequence[str], say: Narrate
) -> tuple[int, dict[int, float]]:
    """The batch size of the most texts/s on `sample` (after a warm-up), and each size's rate."""
    rates: dict[int, float] = {}
    for size in sizes:
        contender = make(size)
        contender.embed(sample[:4])
        seconds, _ = timed(contender, sample)
        rates[size] = significant(len(sample) / seconds)
        say(f"batch size {size}: {rates[size]} texts/s on {len(sample)} texts")
    return max(rates, key=lambda size: rates[size]), rates


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Cosine similarity of each row of `a` with the same row of `b`: min, mean, the worst row."""
    # a, b: [texts, dims]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cos = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    return {
        "min_cosine": round(float(cos.min()), 6),
        "mean_cosine": round(float(cos.mean()), 6),
        "worst_text": int(cos.argmin()),
    }


def compare(
    timings: dict[str, Timings], texts: int, tokens: int, ours: str
) -> dict[str, dict[str, Any]]:
    """Every contender's rates, and beside each other one: ours / theirs (best runs) and the
    cosine agreement of ours with it."""
    sections = {name: t.summary(texts, tokens) for name, t in timings.items()}
    mine = timings[ours]
    for name, theirs in timings.items():
        if name == ours:
            continue
        section = sections[name]
        section[f"{ours}_ratio"] = ratio(min(theirs.seconds), min(mine.seconds))
        if mine.vectors is not None and theirs.vectors is not None:
            section[f"agreement_with_{ours}"] = agreement(mine.vectors, theirs.vectors)
    return sections
