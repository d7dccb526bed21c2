"""`bench engine --workload shared-prefix`: what prefix caching buys. The same requests (one
seeded system prompt, then each its own question; all at once) run with prefix caching and
without, alternating, each run from an empty cache; the faster run of each is compared."""

from __future__ import annotations

import gc
import random
from dataclasses import replace
from typing import Any

from gpu.engine import Engine, EngineRequest
from gpu.sequence import SamplingParams
from ops.bench.report import Narrate, Report, alternate, quiet, ratio
from ops.bench.runs import engine_facts, measure, warm
from ops.bench.workload import allowed_token_ids

QUESTION_TOKENS = (16, 64)
OUTPUT_TOKENS = 32


def shared_prefix_workload(
    engine: Engine, requests: int, seed: int, prefix_tokens: int
) -> list[EngineRequest]:
    """`requests` requests: one seeded system prompt, then seeded questions."""
    longest = prefix_tokens + QUESTION_TOKENS[1] + OUTPUT_TOKENS
    if longest > engine.max_model_len:
        raise ValueError(
            f"a {prefix_tokens}-token prefix, questions up to {QUESTION_TOKENS[1]} tokens and "
            f"{OUTPUT_TOKENS} new tokens exceed the engine's max_model_len {engine.max_model_len}"
        )
    rng, allowed = random.Random(seed), allowed_token_ids(engine)
    system = rng.choices(allowed, k=prefix_tokens)
    params = SamplingParams(max_new_tokens=OUTPUT_TOKENS, ignore_eos=True)
    return [
        EngineRequest(f"shared-{i}", system + rng.choices(allowed, k=rng.randint(*QUESTION_TOKENS)),
                      params)
        for i in range(requests)
    ]  # fmt: skip


def run_shared_prefix(
    engine: Engine, requests: int, seed: int, prefix_tokens: int = 512, repeats: int = 1,
    say: Narrate = quiet,
) -> Report:  # fmt: skip
    """The workload with and without prefix caching; the report."""
    work = shared_prefix_workload(engine, requests, seed, prefix_tokens)
    engines: dict[str, Engine] = {("on" if engine.prefix_caching else "off"): engine}
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    outputs: dict[str, list[list[int]]] = {}
    for setting in alternate(("on", "off"), repeats):
        if setting not in engines:
            engines[setting] = Engine(
                engine.model,
                replace(engine.config, prefix_caching=setting == "on"),
                draft=engine.draft_model,
            )
        eng = engines[setting]
        if setting == "on" and not eng.prefix_caching:
            raise ValueError(f"{engine.model.name}: its engine runs without prefix caching")
        say(f"shared prefix: {len(work)} requests, prefix caching {setting}")
        warm(eng, work[0].prompt_token_ids)
        eng.reset_prefix_cache()  # every run starts cold: no earlier run's blocks
        run = measure(eng, work)
        steps = run.run.steps
        prompt = sum(s.prompt_tokens for s in steps)
        cached = sum(s.cached_prompt_tokens for s in steps)
        runs[setting].append(run.stats() | {
            "prefill_tokens_computed": sum(s.num_prefill_tokens for s in steps),
            "cached_prompt_tokens": cached,
            "prefix_hit_ratio": ratio(cached, prompt, 4) if prompt else None,
        })  # fmt: skip
        outputs.setdefault(setting, run.tokens)
        gc.collect()
    on, off = (min(runs[s], key=lambda r: r["wall_s"]) for s in ("on", "off"))  # least disturbed
    ttft = ratio(off["ttft_ms"]["p50"], on["ttft_ms"]["p50"], 2)
    rate = ratio(on["output_tokens_per_s"], off["output_tokens_per_s"], 2)
    report = Report("engine-shared-prefix")
    report["model"] = engine_facts(engine)
    report["workload"] = {
        "seed": seed, "requests": len(work), "shared_prefix_tokens": prefix_tokens,
        "question_len_range": list(QUESTION_TOKENS), "output_tokens_each": OUTPUT_TOKENS,
        "arrivals": "all at once", "sampling": "greedy, EOS ignored",
    }  # fmt: skip
    report |= {
        "caching_on": on,
        "caching_off": off,
        "runs": {"caching_on": runs["on"], "caching_off": runs["off"]},
        "outputs_identical": outputs["on"] == outputs["off"],
    }
    report["ratios"] = {"ttft_p50_off_over_on": ttft, "throughput_on_over_off": rate}
    report.target("ttft_p50_off_over_on", ttft, 3.0)
    report.target("throughput_on_over_off", rate, 1.5)
    for name, r in (("caching on", on), ("caching off", off)):
        report.headline(name, r, "ttft_ms", "output_tokens_per_s", "prefix_hit_ratio")
    report.headline("outputs identical", str(report["outputs_identical"]))
    return report.finish()
