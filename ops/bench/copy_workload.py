"""`bench engine --workload copy`: rewrite, extract, code-fix, table, proofread and reformat
jobs (`ops/bench/copy_prompts.py`), each one user message under the model's chat template,
greedy, stopping at EOS: answers that copy long spans of their input, where prompt lookup
guesses well."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpu.engine import EngineRequest
from gpu.sequence import SamplingParams
from ops.bench.copy_prompts import KINDS, PROMPTS, CopyPrompt

if TYPE_CHECKING:
    from gpu.engine import Engine


def copy_prompts(count: int | None = None) -> list[CopyPrompt]:
    """The first `count` prompts (default all), taking the kinds in turn: any count is a mix."""
    by_kind = [[p for p in PROMPTS if p.kind == kind] for kind in KINDS]
    turns = [
        p for i in range(max(map(len, by_kind))) for group in by_kind for p in group[i : i + 1]
    ]
    return turns[:count]


def copy_requests(
    engine: Engine, count: int | None, max_new_tokens: int, prefix: str = "copy-"
) -> list[EngineRequest]:
    """The prompts as greedy requests of up to `max_new_tokens` new tokens, each stopping at
    EOS. ValueError when the model has no chat template, or a prompt cannot fit."""
    tokenizer = engine.model.tokenizer
    if not tokenizer.chat_template:
        raise ValueError(f"{engine.model.name} has no chat template: the copy workload needs one")
    prompts = copy_prompts(count)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p.text}]) for p in prompts]
    ids = tokenizer.encode_batch(texts, add_special_tokens=False)
    longest = max(map(len, ids)) + max_new_tokens
    if longest > engine.max_model_len:
        raise ValueError(
            f"copy prompts of up to {max(map(len, ids))} tokens and {max_new_tokens} new tokens "
            f"exceed the engine's max_model_len {engine.max_model_len}"
        )
    params = SamplingParams(max_new_tokens=max_new_tokens)
    return [EngineRequest(f"{prefix}{i}", p, params) for i, p in enumerate(ids)]


def describe_copy(requests: Sequence[EngineRequest]) -> dict[str, Any]:
    kinds = [p.kind for p in copy_prompts(len(requests))]
    return {
        "name": "copy", "requests": len(requests),
        "kinds": {k: kinds.count(k) for k in KINDS if k in kinds},
        "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "max_new_tokens": requests[0].params.max_new_tokens if requests else None,
        "prompts": "ops/bench/copy_prompts.py, one user message each, the model's chat template",
        "sampling": "greedy, stops at EOS or max_new_tokens",
    }  # fmt: skip
