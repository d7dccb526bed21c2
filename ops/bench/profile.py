"""Profiling for the engine benchmark: engine steps under torch.profiler.

`profile_engine` runs the start of a workload under the profiler, writes one Chrome trace
for the prefill steps and one for the decode steps that follow, and summarises each phase's
top ops by self CPU time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from gpu.engine import Engine, EngineRequest
from ops.bench.flops import DecodeTracker


@contextmanager
def _profiler(device: torch.device) -> Iterator[torch.profiler.profile]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        yield prof


STEP_LABEL = "engine.step"
OUTSIDE_TORCH = "engine.step: Python outside torch ops (scheduler, prepare, collect)"


def _top_ops(prof: torch.profiler.profile, limit: int = 15) -> list[dict[str, Any]]:
    """Ops by self CPU time; the per-step labels' self time is the step's Python, summed."""
    calls: dict[str, int] = {}
    self_us: dict[str, float] = {}
    for e in prof.key_averages():
        name = OUTSIDE_TORCH if e.key.startswith(STEP_LABEL) else e.key
        calls[name] = calls.get(name, 0) + e.count
        self_us[name] = self_us.get(name, 0.0) + e.self_cpu_time_total
    total = sum(self_us.values()) or 1.0
    ranked = sorted(self_us, key=self_us.__getitem__, reverse=True)[:limit]
    return [
        {
            "name": name,
            "calls": calls[name],
            "self_cpu_ms": round(self_us[name] / 1e3, 2),
            "self_cpu_pct": round(100 * self_us[name] / total, 1),
        }
        for name in ranked
    ]


def profile_engine(
    engine: Engine, requests: Sequence[EngineRequest], out_dir: Path, decode_steps: int
) -> dict[str, Any]:
    """Run the start of `requests` (ids not yet used by the engine) under the profiler, in
    two Chrome traces: "prefill", the steps up to and including the first pure-decode one,
    and "decode", the next `decode_steps` steps. The remaining requests are then aborted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in requests:
        engine.add(r)
    tracker = DecodeTracker({r.request_id: len(r.prompt_token_ids) for r in requests})
    report: dict[str, Any] = {}
    for phase, limit in (("prefill", 256), ("decode", decode_steps)):
        steps = 0
        with _profiler(engine.model.device) as prof:
            while engine.has_work() and steps < limit:
                with torch.profiler.record_function(f"{STEP_LABEL} {phase} #{steps}"):
                    out = engine.step()
                steps += 1
                is_decode = tracker.observe(out.stats, [i for i, _ in out.new_tokens]) is not None
                if phase == "prefill" and is_decode:
                    break
        trace = out_dir / f"engine-{phase}-trace.json"
        prof.export_chrome_trace(str(trace))
        report[phase] = {"trace": str(trace), "steps": steps, "top_ops": _top_ops(prof)}
    for r in requests:
        engine.abort(r.request_id)
    return report
