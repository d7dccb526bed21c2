"""`tokenmill bench json`: what JSON-schema constraints cost per engine step.

For each batch size the same seeded random-token prompts run twice through one engine: free
(greedy, EOS ignored) and constrained by a schema whose JSON cannot close within the token
budget (an array of at least `MIN_ITEMS` small objects), so both runs generate exactly the
same number of tokens and only the masks differ: building them on the host (the grammar
library, on its own threads) and applying them on the device, and advancing each matcher by
its token. On CPU the engine's step clock also times each step's phases (it costs nothing
there): the grammar's cost is then the sample and collect phases' growth, which a busy host's
noise in the forward pass does not blur. `run_json_bench` returns one JSON-ready dict; it
reports, never asserts.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu.engine import Engine, EngineRequest
from gpu.sequence import JsonConstraint, SamplingParams
from ops.bench.step_time import timed
from ops.models.offline import run_all

MIN_ITEMS = 1000  # more items than any budget can emit: every constrained run hits its length
ITEM_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "name", "kind", "score", "ok"],
    "additionalProperties": False,
}
BENCH_SCHEMA = {"type": "array", "items": ITEM_SCHEMA, "minItems": MIN_ITEMS}


@dataclass(frozen=True)
class JsonBenchOptions:
    batch_sizes: tuple[int, ...] = (1, 64)
    prompt_tokens: int = 32
    new_tokens: int = 32
    seed: int = 0


def _prompts(engine: Engine, count: int, length: int, seed: int) -> list[list[int]]:
    special = set(engine.model.eos_token_ids)
    vocab = min(engine.model.config.vocab_size, engine.model.tokenizer.vocab_size)
    rng = random.Random(seed)
    allowed = [t for t in range(vocab) if t not in special]
    return [[rng.choice(allowed) for _ in range(length)] for _ in range(count)]


def _timed_run(engine: Engine, requests: Sequence[EngineRequest]) -> dict[str, Any]:
    start = time.perf_counter()
    breakdown: dict[str, Any] | None = None
    if engine.model.device.type == "cpu":
        run, breakdown = timed(engine, lambda: run_all(engine, list(requests)))
    else:  # on CUDA the clock synchronizes at every phase: the rate would not be the engine's
        run = run_all(engine, list(requests))
    wall = time.perf_counter() - start
    tokens = run.output_tokens
    phases = breakdown["ms_per_step"] if breakdown else None
    return {
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "steps": len(run.steps),
        "output_tokens_per_s": round(tokens / wall, 2),
        "ms_per_step": round(wall * 1e3 / max(len(run.steps), 1), 3),
        "finish_reasons": sorted({c.finish_reason for c in run.completions}),
        # masks are built and applied in "sample"; matchers advance in "collect"
        "sample_collect_ms_per_step": (
            round(phases["sample"] + phases["collect"], 3) if phases else None
        ),
        "step_time": breakdown,
    }


def run_json_bench(engine: Engine, options: JsonBenchOptions) -> dict[str, Any]:
    """Free vs constrained tokens/s at each batch size, and the per-step cost of the masks."""
    o = options
    constraint = JsonConstraint(json.dumps(BENCH_SCHEMA, separators=(",", ":")), strict=True)
    free = SamplingParams(max_new_tokens=o.new_tokens, ignore_eos=True)
    constrained = SamplingParams(max_new_tokens=o.new_tokens, ignore_eos=True, json=constraint)
    # Warm-up: the first constrained request builds the library's view of the vocabulary.
    warm = _prompts(engine, 2, 8, o.seed)
    run_all(engine, [EngineRequest(f"warm-{i}", p, constrained) for i, p in enumerate(warm)])
    run_all(engine, [EngineRequest(f"warm-free-{i}", p, free) for i, p in enumerate(warm)])
    rows: dict[str, Any] = {}
    for batch in o.batch_sizes:
        prompts = _prompts(engine, batch, o.prompt_tokens, o.seed + batch)
        plain = _timed_run(engine, [EngineRequest(f"f{i}", p, free) for i, p in enumerate(prompts)])
        masked = _timed_run(
            engine, [EngineRequest(f"j{i}", p, constrained) for i, p in enumerate(prompts)]
        )
        rows[str(batch)] = {
            "free": plain,
            "constrained": masked,
            "throughput_ratio": round(
                masked["output_tokens_per_s"] / max(plain["output_tokens_per_s"], 1e-9), 3
            ),
            "added_ms_per_step": round(masked["ms_per_step"] - plain["ms_per_step"], 3),
            "grammar_ms_per_step": (
                round(masked["sample_collect_ms_per_step"] - plain["sample_collect_ms_per_step"], 3)
                if plain["step_time"]
                else None
            ),
        }
    m = engine.model
    return {
        "model": {"name": m.name, "digest": m.digest},
        "device": str(m.device),
        "dtype": str(m.dtype).removeprefix("torch."),
        "grammar_library": "llguidance",
        "schema": BENCH_SCHEMA,
        "options": {**o.__dict__, "batch_sizes": list(o.batch_sizes)},
        "batches": rows,
    }


def json_summary(report: dict[str, Any]) -> str:
    """A few lines for a person; the JSON holds everything."""
    lines = [f"{report['model']['name']} · {report['device']} {report['dtype']} · llguidance"]
    for batch, row in report["batches"].items():
        free, masked = row["free"], row["constrained"]
        lines.append(
            f"  batch {batch:>3}  free {free['output_tokens_per_s']:>9.1f} tok/s  "
            f"json {masked['output_tokens_per_s']:>9.1f} tok/s  ratio {row['throughput_ratio']}"
            f"  (+{row['added_ms_per_step']} ms/step; grammar "
            f"{row['grammar_ms_per_step']} ms/step)"
        )
    return "\n".join(lines)
