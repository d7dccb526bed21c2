"""StepClock: where an engine step's wall time goes, phase by phase (for benchmarks).

Off unless a benchmark sets `Engine.timing`; the engine then sums, over the steps it runs,
the wall time of each phase of a step:

    schedule   the scheduler's decisions (admission, preemption, chunking)
    prepare    host lists → index tensors and attention metadata
    forward    the model's forward pass, attention included
    attention  paged attention (K/V writes, gathers, SDPA), every layer
    sample     logits → tokens
    collect    the engine's bookkeeping after sampling (stop checks, completions)

and the whole step's. What no phase covers (Python between phases) is the step minus the
phases. On CUDA the device is synchronized at every boundary, so the times are the device's
too (and the step slower: a benchmark that wants the true rate runs without a clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

PHASES = ("schedule", "prepare", "forward", "attention", "sample", "collect")


@dataclass
class StepClock:
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    step_seconds: float = 0.0
    steps: int = 0

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def lap(self, phase: str, since: float) -> float:
        """Add the time from `since` to now to `phase`; returns now (the next phase's start)."""
        now = self.now()
        self.seconds[phase] += now - since
        return now

    def step_done(self, began: float) -> None:
        self.step_seconds += self.now() - began
        self.steps += 1

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.step_seconds, self.steps = 0.0, 0

    def breakdown(self) -> dict[str, object]:
        """Mean ms per step of each phase (forward without attention as `dense`), the step's
        mean ms, and each part's share of it; `other` is what no phase covers."""
        if self.steps == 0:
            return {"steps": 0}
        s = self.seconds
        parts = {
            "schedule": s["schedule"],
            "prepare": s["prepare"],
            "dense": s["forward"] - s["attention"],  # matmuls, norms, rotary, MLP, lm head
            "attention": s["attention"],
            "sample": s["sample"],
            "collect": s["collect"],
        }
        parts["other"] = max(self.step_seconds - sum(parts.values()), 0.0)
        step = self.step_seconds or 1e-12
        return {
            "steps": self.steps,
            "step_ms": round(self.step_seconds / self.steps * 1e3, 3),
            "ms_per_step": {k: round(v / self.steps * 1e3, 3) for k, v in parts.items()},
            "fraction": {k: round(v / step, 4) for k, v in parts.items()},
        }
