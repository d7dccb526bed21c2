"""`bench json`: the per-step cost of JSON-schema constraints (`tokenmill bench json --help`).
On a CPU the step clock times each phase: the grammar's cost is the growth of the sample and
collect phases, which noise in the forward pass does not blur."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from gpu.engine import Engine, EngineRequest
from gpu.sequence import Constraint, SamplingParams
from ops.bench.report import Report, ratio
from ops.bench.runs import engine_facts, measure
from ops.bench.workload import random_prompts

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


def _run(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, tag: str
) -> dict[str, Any]:
    requests = [EngineRequest(f"{tag}{i}", p, params) for i, p in enumerate(prompts)]
    run = measure(engine, requests, clock=engine.model.device.type == "cpu")
    # masks are built and applied in "sample"; matchers advance in "collect"
    phases = run.step_time["ms_per_step"] if run.step_time else None
    grammar = round(phases["sample"] + phases["collect"], 3) if phases else None
    return run.stats() | {
        "ms_per_step": round(run.wall_s * 1e3 / max(len(run.run.steps), 1), 3),
        "finish_reasons": sorted({c.finish_reason for c in run.run.completions}),
        "sample_collect_ms_per_step": grammar,
    }


def run_json_bench(engine: Engine, o: JsonBenchOptions) -> Report:
    """Free vs constrained tokens/s at each batch size, and the per-step cost of the masks."""
    constraint = Constraint.json(json.dumps(BENCH_SCHEMA, separators=(",", ":")), strict=True)
    free = SamplingParams(max_new_tokens=o.new_tokens, ignore_eos=True)
    constrained = SamplingParams(
        max_new_tokens=o.new_tokens, ignore_eos=True, constraint=constraint
    )
    # Warm-up: the first constrained request builds the library's view of the vocabulary.
    warm = random_prompts(engine, 2, 8, o.seed)
    _run(engine, warm, constrained, "warm-json-")
    _run(engine, warm, free, "warm-free-")
    report = Report("json")
    report |= {"model": engine_facts(engine), "grammar_library": "llguidance",
               "schema": BENCH_SCHEMA, "options": asdict(o), "batches": {}}  # fmt: skip
    for batch in o.batch_sizes:
        prompts = random_prompts(engine, batch, o.prompt_tokens, o.seed + batch)
        plain, masked = _run(engine, prompts, free, "f"), _run(engine, prompts, constrained, "j")
        grammar = plain["sample_collect_ms_per_step"]
        if grammar is not None:
            grammar = round(masked["sample_collect_ms_per_step"] - grammar, 3)
        row = {
            "free": plain,
            "constrained": masked,
            "throughput_ratio": ratio(masked["output_tokens_per_s"], plain["output_tokens_per_s"]),
            "added_ms_per_step": round(masked["ms_per_step"] - plain["ms_per_step"], 3),
            "grammar_ms_per_step": grammar,
        }
        report["batches"][str(batch)] = row
        report.headline(f"batch {batch}", row, "throughput_ratio", "added_ms_per_step")
    return report.finish()
