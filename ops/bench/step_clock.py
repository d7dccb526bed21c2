"""StepClock: where an engine step's wall time goes, phase by phase (for benchmarks).

An engine observer (`gpu.step_observer`): attached with `engine.observe(clock)`, it sums, over
the steps the engine runs, the wall time of each phase of a step (schedule, prepare, forward,
sample, collect) and of paged attention inside the forward (every layer's `ops.attention`,
timed through the ops it wraps), and the whole step's. What no phase covers (Python between
phases) is the step minus the phases. On CUDA the device is synchronized at every boundary,
so the times are the device's too (and the step slower: a benchmark that wants the true rate
runs without a clock). A whole-step fast path (the native one-call decode step) calls no
layer op: its attention counts as dense.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu.backends.layer_ops import LayerOps

PHASES = ("schedule", "prepare", "forward", "attention", "sample", "collect")


@dataclass
class StepClock:
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    step_seconds: float = 0.0
    steps: int = 0
    _began: float = 0.0
    _last: float = 0.0

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    # -- the engine's observer -----------------------------------------------------------

    def step_began(self) -> None:
        self._began = self._last = self.now()

    def phase_done(self, phase: str) -> None:
        now = self.now()
        self.seconds[phase] += now - self._last
        self._last = now

    def step_done(self) -> None:
        self.step_seconds += self.now() - self._began
        self.steps += 1

    def wrap(self, ops: LayerOps) -> LayerOps:
        return _TimedAttention(ops, self)

    # -- results ---------------------------------------------------------------------------

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


class _TimedAttention:
    """Layer operations that add each `attention` call's time to the clock's "attention"."""

    def __init__(self, ops: LayerOps, clock: StepClock) -> None:
        self._ops = ops
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def attention(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        began = self._clock.now()
        out: torch.Tensor = self._ops.attention(*args, **kwargs)
        self._clock.seconds["attention"] += self._clock.now() - began
        return out
