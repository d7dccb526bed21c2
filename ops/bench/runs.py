"""Running requests on an engine in this process and measuring it, through the engine's public
methods only (`add`, `step`, `has_work`, `abort`, `observe`): the runs of `bench engine`, `json`,
`quant` and the direct engine of `bench pipeline`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpu.engine import Completion, Engine, EngineRequest
from gpu.sequence import SamplingParams
from ops.bench.flops import DecodeTracker
from ops.bench.report import percentiles
from ops.bench.step_clock import StepClock
from ops.bench.workload import Workload
from ops.models.offline import OfflineRun

BATCH1_PROMPT_TOKENS = 128
BATCH1_NEW_TOKENS = 128


def engine_facts(engine: Engine) -> dict[str, Any]:
    """The model and how the engine runs it, for a report."""
    m = engine.model
    return {
        "name": m.name, "digest": m.digest, "arch": m.config.arch,
        "parameters": m.config.num_parameters(), "device": str(m.device),
        "dtype": str(m.dtype).removeprefix("torch."), "linear_kernel": m.linear_kernel,
        "attention_kernel": engine.attention_kernel, "block_size": engine.config.block_size,
        "kv_blocks": engine.num_blocks,
    }  # fmt: skip


@dataclass
class Measured:
    run: OfflineRun
    wall_s: float
    sampled: list[list[str]]  # per step, the request ids that got a token
    step_time: dict[str, Any] | None  # the StepClock's breakdown, when clocked

    @property
    def tokens(self) -> list[list[int]]:
        return [c.token_ids for c in self.run.completions]

    def stats(self) -> dict[str, Any]:
        run, wall = self.run, self.wall_s
        return {
            "requests": len(run.completions), "prompt_tokens": run.prompt_tokens,
            "output_tokens": run.output_tokens, "wall_s": round(wall, 3),
            "output_tokens_per_s": round(run.output_tokens / wall, 2) if wall > 0 else None,
            "steps": len(run.steps), "preemptions": sum(s.num_preempted for s in run.steps),
            "peak_kv_blocks": max((s.kv_blocks_used for s in run.steps), default=0),
            "ttft_ms": percentiles([c.ttft_ms for c in run.completions]),
            "tpot_ms": percentiles([c.tpot_ms for c in run.completions]),
            "step_time": self.step_time,
        }  # fmt: skip


def measure(engine: Engine, requests: Sequence[EngineRequest], *, clock: bool = False) -> Measured:
    """`requests` added at once and stepped to the end. `clock` observes every step's phases
    (free on a CPU; on CUDA it synchronizes at each phase, so the rate is not the engine's)."""
    timer = StepClock(engine.model.device) if clock else None
    done: dict[str, Completion] = {}
    run, sampled = OfflineRun([]), []
    engine.observe(timer)
    try:
        with torch.inference_mode():
            start = time.perf_counter()
            for request in requests:
                engine.add(request)
            while engine.has_work():
                out = engine.step()
                run.steps.append(out.stats)
                sampled.append([rid for rid, _ in out.new_tokens])
                done |= {c.request_id: c for c in out.finished}
            wall = time.perf_counter() - start
    finally:
        engine.observe(None)
    run.completions = [done[r.request_id] for r in requests]
    return Measured(run, wall, sampled, timer.breakdown() if timer else None)


def warm(engine: Engine, prompt: Sequence[int], tag: str = "warmup") -> None:
    """Two short unmeasured requests: first-use costs stay out of the measured run."""
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    measure(engine, [EngineRequest(f"{tag}-{i}", list(prompt[:8]), params) for i in range(2)])


def batch1(engine: Engine, seed: int, tokens: int = BATCH1_NEW_TOKENS) -> dict[str, Any]:
    """One request alone (a `tokens`-token prompt, as many new; less where the model is
    shorter): decode tok/s and ms a step after the first token, then the same run again with
    the step clock on, for the decode steps' breakdown."""
    prompt = min(tokens, engine.max_model_len // 2)
    new = min(tokens, engine.max_model_len - prompt)
    (work,) = Workload(seed=seed).fixed(1, prompt, new).build(engine)
    params = SamplingParams(max_new_tokens=work.max_new_tokens, ignore_eos=True)
    bare = _decode_steps(engine, EngineRequest("batch1", work.prompt_token_ids, params))
    clock = StepClock(engine.model.device)
    _decode_steps(engine, EngineRequest("batch1-timed", work.prompt_token_ids, params), clock)
    decode_s = sum(bare)
    return {
        "prompt_tokens": len(work.prompt_token_ids), "new_tokens": work.max_new_tokens,
        "decode_tokens_per_s": round(len(bare) / decode_s, 2) if decode_s else None,
        "decode_step_ms": round(decode_s / len(bare) * 1e3, 3) if bare else None,
        "breakdown": clock.breakdown(),
    }  # fmt: skip


def _decode_steps(
    engine: Engine, request: EngineRequest, clock: StepClock | None = None
) -> list[float]:
    """Run `request` alone; the seconds of each step after the one that gave its first token.
    With `clock`, those decode steps are timed phase by phase."""
    engine.add(request)
    steps: list[float] = []
    try:
        with torch.inference_mode():
            while engine.has_work():
                start = time.perf_counter()
                out = engine.step()
                if out.new_tokens:
                    steps.append(time.perf_counter() - start)
                    if len(steps) == 1:
                        engine.observe(clock)  # from the first decode step on
    finally:
        engine.observe(None)
    return steps[1:]


def profile_engine(
    engine: Engine, requests: Sequence[EngineRequest], out_dir: Path, decode_steps: int
) -> dict[str, Any]:
    """The start of `requests` under torch.profiler, as two Chrome traces: "prefill" (steps up
    to the first pure-decode one) and "decode" (the next `decode_steps`); the top ops of each
    by self CPU time. The requests still running are then aborted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in requests:
        engine.add(r)
    tracker = DecodeTracker({r.request_id: len(r.prompt_token_ids) for r in requests})
    activities = [torch.profiler.ProfilerActivity.CPU]
    if engine.model.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    report: dict[str, Any] = {}
    for phase, limit in (("prefill", 256), ("decode", decode_steps)):
        steps = 0
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            while engine.has_work() and steps < limit:
                with torch.profiler.record_function(f"engine.step {phase} #{steps}"):
                    out = engine.step()
                steps += 1
                decoding = tracker.observe(out.stats, [i for i, _ in out.new_tokens]) is not None
                if phase == "prefill" and decoding:
                    break
        trace = out_dir / f"engine-{phase}-trace.json"
        prof.export_chrome_trace(str(trace))
        report[phase] = {"trace": str(trace), "steps": steps, "top_ops": _top_ops(prof)}
    for r in requests:
        engine.abort(r.request_id)
    return report


def _top_ops(prof: torch.profiler.profile, limit: int = 15) -> list[dict[str, Any]]:
    """Ops by self CPU time; the step labels' own time (Python outside torch ops) as one."""
    calls: dict[str, int] = {}
    self_us: dict[str, float] = {}
    for e in prof.key_averages():
        name = "engine.step: Python outside torch ops" if e.key.startswith("engine.step") else e.key
        calls[name] = calls.get(name, 0) + e.count
        self_us[name] = self_us.get(name, 0.0) + e.self_cpu_time_total
    total = sum(self_us.values()) or 1.0
    ranked = sorted(self_us, key=self_us.__getitem__, reverse=True)[:limit]
    return [
        {"name": name, "calls": calls[name], "self_cpu_ms": round(self_us[name] / 1e3, 2),
         "self_cpu_pct": round(100 * self_us[name] / total, 1)}
        for name in ranked
    ]  # fmt: skip
