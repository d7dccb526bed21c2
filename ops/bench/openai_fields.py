"""`bench engine --workload openai-fields`: what two OpenAI fields cost, each against its
baseline in the same run, alternating, best run of each kept:

- logprobs: the seeded workload with `logprobs: 5` on every request against without
  (throughput; target ≥ 0.9×);
- n: `--requests` prompts of `--prefix-tokens` tokens, each asked for 4 sampled choices of
  `CHOICE_TOKENS` tokens, against 4 separate requests per prompt: with prefix caching (they
  arrive together, so the cache shares their prompt too) and without it (each prefills its
  prompt, as an engine without prefix caching serves them). Target: n = 4 ≥ 1.5× faster than
  the separate requests without shared prefill.
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Any

from gpu.engine import Engine, EngineRequest
from gpu.sequence import SamplingParams
from ops.bench.report import Narrate, Report, alternate, quiet, ratio
from ops.bench.runs import engine_facts, measure, warm
from ops.bench.workload import Workload, engine_requests, random_prompts

CHOICES = 4
CHOICE_TOKENS = 16
LOGPROBS = 5


def _choice_requests(prompts: list[list[int]], seed: int, *, together: bool) -> list[EngineRequest]:
    """Every prompt's `CHOICES` sampled choices: one request with n, or one request each."""
    params = SamplingParams(
        max_new_tokens=CHOICE_TOKENS, temperature=0.8, seed=seed, ignore_eos=True
    )
    if together:
        return [
            EngineRequest(f"n-{i}", p, replace(params, n=CHOICES)) for i, p in enumerate(prompts)
        ]
    return [
        EngineRequest(f"sep-{i}-{c}", p, replace(params, seed=seed + c))
        for i, p in enumerate(prompts)
        for c in range(CHOICES)
    ]


def _run(engine: Engine, requests: list[EngineRequest]) -> dict[str, Any]:
    warm(engine, requests[0].prompt_token_ids)
    engine.reset_prefix_cache()  # every run starts cold
    run = measure(engine, requests)
    steps, wall = run.run.steps, run.wall_s
    out = sum(len(ch.token_ids) for c in run.run.completions for ch in (c.choices or (c,)))
    return {
        "requests": len(requests), "output_tokens": out, "wall_s": round(wall, 3),
        "output_tokens_per_s": round(out / wall, 2) if wall > 0 else None,
        "prefill_tokens_computed": sum(s.num_prefill_tokens for s in steps),
        "cached_prompt_tokens": sum(s.cached_prompt_tokens for s in steps),
    }  # fmt: skip


def run_openai_fields(
    engine: Engine, workload: Workload, prefix_tokens: int = 512, repeats: int = 1,
    say: Narrate = quiet,
) -> Report:  # fmt: skip
    """The two comparisons; the report."""
    mixed = workload.build(engine)
    plain = engine_requests(mixed, "plain-")
    with_logprobs = [replace(r, params=replace(r.params, logprobs=LOGPROBS)) for r in plain]
    prompts = random_prompts(engine, workload.requests, prefix_tokens, workload.seed)
    uncached = Engine(
        engine.model, replace(engine.config, prefix_caching=False), draft=engine.draft_model
    )
    settings = {
        "without_logprobs": (engine, plain),
        "logprobs_5": (engine, with_logprobs),
        "n4": (engine, _choice_requests(prompts, workload.seed, together=True)),
        "separate_cached": (engine, _choice_requests(prompts, workload.seed, together=False)),
        "separate_uncached": (uncached, _choice_requests(prompts, workload.seed, together=False)),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    for name in alternate(tuple(settings), repeats):
        eng, requests = settings[name]
        say(f"openai fields: {name}, {len(requests)} requests")
        runs[name].append(_run(eng, requests))
        gc.collect()
    best = {name: max(r, key=lambda x: x["output_tokens_per_s"] or 0) for name, r in runs.items()}
    rate = {name: b["output_tokens_per_s"] for name, b in best.items()}
    logprobs_cost = ratio(rate["logprobs_5"], rate["without_logprobs"], 3)
    n_vs_uncached = ratio(rate["n4"], rate["separate_uncached"], 2)
    n_vs_cached = ratio(rate["n4"], rate["separate_cached"], 2)
    report = Report("engine-openai-fields")
    report["model"] = engine_facts(engine)
    report["workload"] = workload.describe(mixed) | {
        "choices": {"prompts": len(prompts), "prompt_tokens": prefix_tokens, "n": CHOICES,
                    "new_tokens_each": CHOICE_TOKENS, "temperature": 0.8},
        "logprobs": LOGPROBS,
    }  # fmt: skip
    report |= {"best": best, "runs": runs}
    report["ratios"] = {
        "logprobs_over_plain": logprobs_cost,
        "n4_over_separate_uncached": n_vs_uncached,
        "n4_over_separate_cached": n_vs_cached,
    }
    report.target("logprobs_over_plain", logprobs_cost, 0.9)
    report.target("n4_over_separate_uncached", n_vs_uncached, 1.5)
    for name, b in best.items():
        report.headline(name, b, "output_tokens_per_s", "prefill_tokens_computed")
    return report.finish()
