"""SmolLM2 and Gemma 3 with speculation: the same greedy tokens as without, batched and alone,
with prompt lookup (and on SmolLM2 with its own int4 copy drafting)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from gpu.speculative.draft_model import load_draft
from ops.models.offline import run_all

pytestmark = pytest.mark.slow

TEXTS = [
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river.",
    "Copy the list: apples, pears, plums, cherries, apricots, peaches, figs and grapes.",
    "def add(a, b):\n    return a + b\n\n# The same function again:\ndef add(a, b):\n",
    "Name: Ada Lovelace. Born: 1815. Name: Alan Turing. Born: 1912. Name: Ada",
]
CONFIG = EngineConfig(max_model_len=256, max_num_batched_tokens=64)


def outputs(
    model: LoadedModel, config: EngineConfig, draft: LoadedModel | None = None
) -> tuple[list[list[int]], int]:
    """Greedy tokens of TEXTS, and how many guessed tokens were kept."""
    engine = Engine(model, config, draft=draft)
    params = SamplingParams(max_new_tokens=32)
    prompts = [model.tokenizer.encode(t) for t in TEXTS]
    done = run_all(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)])
    return [c.token_ids for c in done.completions], sum(
        c.accepted_draft_tokens for c in done.completions
    )


@pytest.mark.parametrize("alone", [False, True], ids=["batched", "alone"])
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_prompt_lookup_keeps_the_tokens(
    smollm2_path: Path, gemma3_path: Path, name: str, alone: bool
) -> None:
    model = load_model(smollm2_path if name == "smollm2" else gemma3_path)
    config = replace(CONFIG, max_num_seqs=1) if alone else CONFIG
    plain, _ = outputs(model, config)
    fast, kept = outputs(model, replace(config, speculative="ngram"))
    assert fast == plain
    assert kept > 0


def test_an_int4_draft_keeps_the_tokens(smollm2_path: Path) -> None:
    model = load_model(smollm2_path)
    draft = load_draft(smollm2_path, model)  # its own checkpoint: int4
    plain, _ = outputs(model, CONFIG)
    config = replace(CONFIG, speculative_model=str(smollm2_path))
    fast, kept = outputs(model, config, draft)
    assert fast == plain
    assert kept > 0
