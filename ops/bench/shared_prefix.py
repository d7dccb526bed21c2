"""`bench engine --workload shared-prefix`: what prefix caching buys, on and off in one run.

Every request starts with the same system prompt (512 random tokens by default) and then asks
its own question (16-64 tokens), for 32 new tokens (greedy, EOS ignored). All requests arrive
at once. The same workload runs on two engines over one loaded model, one with prefix caching
and one without, in alternating order when repeated, and the report gives each run's TTFT
percentiles, output tokens/s and prefill tokens, the ratios, and whether the outputs agree.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from gpu.engine import Engine, EngineRequest
from gpu.sequence import SamplingParams
from ops.bench.engine import percentiles
from ops.bench.narrate import Narrate
from ops.bench.workload import BenchOptions, allowed_token_ids, host_load
from ops.models.offline import OfflineRun, run_all

QUESTION_TOKENS = (16, 64)
OUTPUT_TOKENS = 32
TARGET_TTFT_P50 = 3.0  # cached TTFT p50 at least 3× lower
TARGET_THROUGHPUT = 1.5  # and output tokens/s at least 1.5× higher


def shared_prefix_workload(
    engine: Engine, options: BenchOptions, prefix_tokens: int
) -> list[EngineRequest]:
    """`options.requests` requests: one seeded system prompt, then seeded questions."""
    longest = prefix_tokens + QUESTION_TOKENS[1] + OUTPUT_TOKENS
    if longest > engine.max_model_len:
        raise ValueError(
            f"a {prefix_tokens}-token prefix, questions up to {QUESTION_TOKENS[1]} tokens and "
            f"{OUTPUT_TOKENS} new tokens exceed the engine's max_model_len {engine.max_model_len}"
        )
    rng = random.Random(options.seed)
    allowed = allowed_token_ids(engine)
    system = rng.choices(allowed, k=prefix_tokens)
    params = SamplingParams(max_new_tokens=OUTPUT_TOKENS, ignore_eos=True)
    return [
        EngineRequest(
            f"shared-{i}", system + rng.choices(allowed, k=rng.randint(*QUESTION_TOKENS)), params
        )
        for i in range(options.requests)
    ]


def _run(engine: Engine, requests: Sequence[EngineRequest]) -> tuple[OfflineRun, float]:
    warm = EngineRequest("warmup", list(requests[0].prompt_token_ids[:8]), SamplingParams(4))
    run_all(engine, [warm])
    engine.reset_prefix_cache()  # every run starts cold: no earlier run's blocks
    start = time.perf_counter()
    with torch.inference_mode():
        run = run_all(engine, requests)
    return run, time.perf_counter() - start


def _stats(run: OfflineRun, wall: float) -> dict[str, Any]:
    prompt = sum(s.prompt_tokens for s in run.steps)
    cached = sum(s.cached_prompt_tokens for s in run.steps)
    return {
        "wall_s": round(wall, 3),
        "output_tokens": run.output_tokens,
        "output_tokens_per_s": round(run.output_tokens / wall, 2),
        "ttft_ms": percentiles([c.ttft_ms for c in run.completions]),
        "prefill_tokens_computed": sum(s.num_prefill_tokens for s in run.steps),
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "prefix_hit_ratio": round(cached / prompt, 4) if prompt else None,
        "steps": len(run.steps),
    }


def run_shared_prefix(
    engine: Engine,
    options: BenchOptions,
    prefix_tokens: int = 512,
    repeats: int = 1,
    progress: Narrate | None = None,
) -> dict[str, Any]:
    """Run the workload with and without prefix caching; a JSON-ready report."""
    say = progress or (lambda _: None)
    requests = shared_prefix_workload(engine, options, prefix_tokens)
    engines = {
        True: engine if engine.prefix_caching else None,
        False: engine if not engine.prefix_caching else None,
    }
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    outputs: dict[bool, list[list[int]]] = {}
    # on, off, off, on, on, off, ...: neither setting always runs first
    order = [caching for i in range(repeats) for caching in ((True, False), (False, True))[i % 2]]
    for caching in order:
        eng = engines[caching]
        if eng is None:
            eng = Engine(engine.model, replace(engine.config, prefix_caching=caching))
            engines[caching] = eng
        if caching and not eng.prefix_caching:
            raise ValueError(f"{engine.model.name}: its engine runs without prefix caching")
        say(f"shared prefix: {len(requests)} requests, prefix caching {'on' if caching else 'off'}")
        run, wall = _run(eng, requests)
        runs[caching].append(_stats(run, wall))
        outputs.setdefault(caching, [c.token_ids for c in run.completions])
        gc.collect()
    on, off = _best(runs[True]), _best(runs[False])
    ttft_ratio = _divide(off["ttft_ms"]["p50"], on["ttft_ms"]["p50"])
    rate_ratio = _divide(on["output_tokens_per_s"], off["output_tokens_per_s"])
    m = engine.model
    return {
        "benchmark": "engine-shared-prefix",
        "model": {"name": m.name, "digest": m.digest, "arch": m.config.arch},
        "environment": {
            "device": str(m.device),
            "dtype": str(m.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "host_load_1m_at_end": host_load(),
        },
        "workload": {
            "seed": options.seed,
            "requests": len(requests),
            "shared_prefix_tokens": prefix_tokens,
            "question_len_range": list(QUESTION_TOKENS),
            "output_tokens_each": OUTPUT_TOKENS,
            "block_size": engine.config.block_size,
            "arrivals": "all at once",
            "sampling": "greedy, EOS ignored",
        },
        "caching_on": on,
        "caching_off": off,
        "runs": {"caching_on": runs[True], "caching_off": runs[False]},
        "ratios": {"ttft_p50_off_over_on": ttft_ratio, "throughput_on_over_off": rate_ratio},
        "targets": {
            "ttft_p50": _target(ttft_ratio, TARGET_TTFT_P50),
            "throughput": _target(rate_ratio, TARGET_THROUGHPUT),
        },
        "outputs_identical": outputs[True] == outputs[False],
    }


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run of several (the least disturbed by other work on the host)."""
    return min(runs, key=lambda r: r["wall_s"])


def _divide(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _target(value: float | None, target: float) -> dict[str, Any]:
    return {"target": target, "value": value, "met": None if value is None else value >= target}
