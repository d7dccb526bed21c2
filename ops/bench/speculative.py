"""`bench engine --speculative …` (or `--speculative-model M`): the engine with speculative
decoding against the same engine without, in one run, alternating (`alternate`: baseline,
speculative, speculative, baseline, …), each run after a warm-up and from an empty prefix
cache. The speculative engine keeps its step-aside policy's measurements from run to run, as
a worker would.

Per run: output tokens/s end to end (wall time, prefill included) and decode tokens/s (the
tokens out of decode-only steps over those steps' own time). For speculative runs: the
acceptance rate (accepted / guessed tokens), tokens per verified sequence and step
(accepted / verified + 1), and the share of decode-only steps that speculated (the policy,
`gpu/speculative/policy.py`, decides each step; a step also goes plain when nothing was
guessed). The ratios compare each setting's fastest run, as the other engine benches do;
each round's own ratio is kept beside them. Greedy outputs are the same with speculation and
without: requests whose tokens differ from the first baseline run's are listed."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpu.engine import Engine, EngineRequest
from gpu.engine_io import StepStats
from ops.bench.copy_workload import copy_requests, describe_copy
from ops.bench.report import Narrate, Report, alternate, quiet, ratio
from ops.bench.runs import Measured, engine_facts, measure, warm
from ops.bench.workload import Workload, engine_requests

SETTINGS = ("baseline", "speculative")
RATES = ("decode_tokens_per_s", "output_tokens_per_s")
# Issue 45's targets. At batch 1, decode tokens/s over the baseline's, by (proposer, workload);
# at a larger batch speculation must step aside: output tokens/s at least 0.95 of without.
BATCH1_TARGETS = {("ngram", "copy"): 2.0, ("draft", "mixed"): 1.4}
LARGE_BATCH_TARGET = 0.95

Step = tuple[StepStats, int]  # a step's stats and how many tokens it gave


def baseline_engine(engine: Engine) -> Engine:
    """The same model and settings without speculation, with a KV pool of the same size."""
    config = replace(
        engine.config, speculative=None, speculative_model=None, speculative_k=None,
        num_kv_blocks=engine.num_blocks,
    )  # fmt: skip
    return Engine(engine.model, config)


def steps_of(run: Measured) -> list[Step]:
    return [(s, len(ids)) for s, ids in zip(run.run.steps, run.sampled, strict=True)]


def is_decode_only(s: StepStats) -> bool:
    return s.num_prefill_tokens == 0 and s.num_decode_tokens > 0


def decode_figures(steps: Sequence[Step]) -> dict[str, Any]:
    """Tokens out of decode-only steps over their own time (the measuring loop's time between
    steps is not in it)."""
    decode = [(s, n) for s, n in steps if is_decode_only(s)]
    seconds = sum(s.end_ns - s.start_ns for s, _ in decode) / 1e9
    tokens = sum(n for _, n in decode)
    return {
        "decode_steps": len(decode), "decode_tokens": tokens, "decode_s": round(seconds, 3),
        "decode_tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
        "tokens_per_decode_step": round(tokens / len(decode), 3) if decode else None,
    }  # fmt: skip


def speculation_figures(steps: Sequence[Step]) -> dict[str, Any]:
    """What speculation did over `steps`: guesses, acceptance, tokens per verified sequence
    and step, and the decode-only steps that speculated against those that did not."""
    drafted = sum(s.num_draft_tokens for s, _ in steps)
    accepted = sum(s.num_accepted_draft_tokens for s, _ in steps)
    verified = sum(s.num_verified_seqs for s, _ in steps)
    decode = [(s, n) for s, n in steps if is_decode_only(s)]
    spec = [(s, n) for s, n in decode if s.num_verified_seqs > 0]
    plain = [(s, n) for s, n in decode if s.num_verified_seqs == 0]
    return {
        "proposer": next((s.proposer for s, _ in steps if s.proposer), None),
        "draft_tokens": drafted, "accepted_draft_tokens": accepted, "verified_seqs": verified,
        "acceptance_rate": ratio(accepted, drafted, 4),
        "tokens_per_verified_seq_step": round(accepted / verified + 1, 3) if verified else None,
        "decode_steps_speculated": len(spec), "decode_steps_plain": len(plain),
        "speculated_step_share": ratio(len(spec), len(decode), 4),
        "speculated_step": _mean_step(spec), "plain_step": _mean_step(plain),
    }  # fmt: skip


def _mean_step(steps: Sequence[Step]) -> dict[str, Any] | None:
    """Mean ms, sequences and tokens out of these steps."""
    if not steps:
        return None
    n = len(steps)
    return {
        "ms": round(sum(s.end_ns - s.start_ns for s, _ in steps) / n / 1e6, 3),
        "seqs": round(sum(s.num_seqs for s, _ in steps) / n, 2),
        "tokens": round(sum(t for _, t in steps) / n, 3),
    }


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each setting's fastest run (by decode tokens/s) and, with both settings, the ratios of
    speculative over baseline: of the fastest runs, and of each round."""
    best = {name: max(r, key=lambda x: x["decode_tokens_per_s"] or 0) for name, r in runs.items()}
    if set(runs) != set(SETTINGS):
        return {"best": best, "ratios": None, "round_ratios": []}
    base, spec = best["baseline"], best["speculative"]
    rounds = [
        {k: ratio(s[k], b[k]) for k in RATES}
        for b, s in zip(runs["baseline"], runs["speculative"], strict=False)
    ]
    return {"best": best, "ratios": {k: ratio(spec[k], base[k]) for k in RATES},
            "round_ratios": rounds}  # fmt: skip


def add_target(report: Report, kind: str | None, workload: str, batch: int) -> None:
    """The issue's target for this case, where it sets one."""
    ratios = report["ratios"] or {}
    if kind is None:
        return
    if batch == 1 and (target := BATCH1_TARGETS.get((kind, workload))) is not None:
        name = f"{kind}_{workload}_batch1_decode_vs_baseline"
        report.target(name, ratios.get("decode_tokens_per_s"), target)
    elif batch > 1:
        name = f"{kind}_{workload}_batch{batch}_output_vs_baseline"
        report.target(name, ratios.get("output_tokens_per_s"), LARGE_BATCH_TARGET)


def run_speculative_bench(
    engine: Engine, workload_name: str, workload: Workload, repeats: int, say: Narrate = quiet
) -> Report:
    """`--workload copy` (the copy prompts, at most `workload.requests`, up to
    `workload.max_output` new tokens) or `mixed` (the seeded random-token workload, greedy,
    EOS ignored) through `run_speculative`."""
    if workload_name == "copy":
        requests = copy_requests(engine, workload.requests, workload.max_output)
        return run_speculative(engine, requests, describe_copy(requests), repeats, say)
    built = workload.build(engine)
    described = {"name": "mixed"} | workload.describe(built) | {
        "prompts": "uniform random token ids, special/EOS/BOS ids excluded",
        "sampling": "greedy, EOS ignored: exactly the asked output length",
    }  # fmt: skip
    return run_speculative(engine, engine_requests(built, "spec-"), described, repeats, say)


def run_speculative(
    engine: Engine, requests: Sequence[EngineRequest], workload: dict[str, Any],
    repeats: int = 3, say: Narrate = quiet,
) -> Report:  # fmt: skip
    """`requests` on `engine` and on `baseline_engine(engine)`, alternating; the report.
    Without speculation on `engine`, its runs alone (no ratios)."""
    spec = engine.config.speculation()
    engines = {"baseline": engine}
    if spec is not None:
        engines = {"baseline": baseline_engine(engine), "speculative": engine}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    every: dict[str, list[Step]] = {name: [] for name in engines}
    reference: list[list[int]] | None = None
    clock = engine.model.device.type == "cpu"  # the step clock is free on a CPU
    for name in alternate(tuple(engines), repeats):
        eng = engines[name]
        say(f"speculative: {name} run {len(runs[name]) + 1}, {len(requests)} requests")
        warm(eng, requests[0].prompt_token_ids)
        eng.reset_prefix_cache()  # every run starts cold: no earlier run's blocks
        run = measure(eng, requests, clock=clock)
        steps = steps_of(run)
        reference = reference or run.tokens
        differing = [
            i for i, (a, b) in enumerate(zip(run.tokens, reference, strict=True)) if a != b
        ]
        figures = run.stats() | decode_figures(steps) | {"differing_from_baseline": differing}
        if name == "speculative":
            figures["speculation"] = speculation_figures(steps)
        runs[name].append(figures)
        every[name] += steps
        gc.collect()
    batch = min(engine.config.max_num_seqs, len(requests))
    name = f"engine-speculative-{workload.get('name', 'mixed')}"
    report = Report(name)
    report["model"] = engine_facts(engine)
    report["speculation"] = {
        "config": spec.describe() if spec else None,
        "draft_model": getattr(engine.draft_model, "name", None),
        "batch": batch, "repeats": repeats,
    }  # fmt: skip
    report["workload"] = dict(workload)
    report |= compare(runs)
    report["runs"] = runs
    if spec is not None:
        report["speculation"]["overall"] = speculation_figures(every["speculative"])
    add_target(report, spec.kind if spec else None, workload.get("name", "mixed"), batch)
    _headlines(report)
    return report.finish()


def _headlines(report: Report) -> None:
    for name, b in report["best"].items():
        report.headline(name, b, *RATES, "output_tokens", "wall_s")
    overall = report["speculation"].get("overall")
    if overall is not None:
        keys = ("acceptance_rate", "tokens_per_verified_seq_step", "speculated_step_share")
        report.headline("speculation", overall, *keys)
    if report["ratios"] is not None:
        report.headline("speculative / baseline", report["ratios"])
    differing = {n: [r["differing_from_baseline"] for r in rs] for n, rs in report["runs"].items()}
    if any(d for runs in differing.values() for d in runs):
        report["warnings"].append(f"greedy outputs differ from the first baseline run: {differing}")
