"""gpu.encoder.pooling: every mode over a packed batch, against a per-sequence reference and
against sentence-transformers' own `Pooling` over the same sequences padded."""

from __future__ import annotations

import pytest
import torch

from gpu.encoder.pipeline import POOLING_MODES
from gpu.encoder.pooling import pool

LENGTHS = [1, 4, 7, 2]


def reference(one: torch.Tensor, mode: str) -> torch.Tensor:  # one: [n, hidden] -> [hidden]
    n = one.shape[0]
    weights = torch.arange(1, n + 1, dtype=one.dtype).unsqueeze(1)
    return {
        "cls": one[0],
        "lasttoken": one[-1],
        "max": one.max(0).values,
        "mean": one.mean(0),
        "mean_sqrt_len_tokens": one.sum(0) / n**0.5,
        "weightedmean": (one * weights).sum(0) / weights.sum(),
    }[mode]


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_each_mode_per_sequence(mode: str) -> None:
    torch.manual_seed(0)
    states = torch.randn(sum(LENGTHS), 8)
    pooled = pool(states, LENGTHS, (mode,))
    expected = torch.stack([reference(one, mode) for one in states.split(LENGTHS)])
    torch.testing.assert_close(pooled, expected)


def test_modes_concatenate_in_order() -> None:
    states = torch.randn(sum(LENGTHS), 8)
    both = pool(states, LENGTHS, ("cls", "mean"))
    torch.testing.assert_close(both[:, :8], pool(states, LENGTHS, ("cls",)))
    torch.testing.assert_close(both[:, 8:], pool(states, LENGTHS, ("mean",)))


@pytest.mark.slow  # imports sentence-transformers (seconds)
def test_as_sentence_transformers_pools_a_padded_batch() -> None:
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(1)
    states = torch.randn(sum(LENGTHS), 8)
    width = max(LENGTHS)
    padded = torch.zeros(len(LENGTHS), width, 8)
    mask = torch.zeros(len(LENGTHS), width, dtype=torch.int64)
    for i, one in enumerate(states.split(LENGTHS)):
        padded[i, : len(one)] = one
        mask[i, : len(one)] = 1
    modes = tuple(POOLING_MODES)
    theirs = Pooling(8, pooling_mode=modes)({"token_embeddings": padded, "attention_mask": mask})[
        "sentence_embedding"
    ]
    torch.testing.assert_close(pool(states, LENGTHS, modes), theirs)
