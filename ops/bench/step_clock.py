"""StepClock: an engine observer (`gpu.step_observer`, attached with `engine.observe(clock)`)
summing the wall time of each phase of a step, of paged attention inside the forward (timed
through the layer op it wraps), and of the whole step; what no phase covers is `other`. On CUDA
it synchronizes at every boundary: the times are the device's, and the step slower. A whole-step
fast path (the native one-call decode step) calls no layer op: its attention counts as dense.
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

    def now(self) -> float:  # on CUDA, synchronized
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

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

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.step_seconds, self.steps = 0.0, 0

    def breakdown(self) -> dict[str, object]:
        """Mean ms per step of each phase (forward without attention as `dense`), the step's
        mean ms, and each part's share of it; `other` is what no phase covers."""
        if self.steps == 0:
            return {"steps": 0}
        s = self.seconds
        parts = {k: s[k] for k in ("schedule", "prepare")}
        parts["dense"] = s["forward"] - s["attention"]  # matmuls, norms, rotary, MLP, lm head
        parts |= {k: s[k] for k in ("attention", "sample", "collect")}
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
        self._ops, self._clock = ops, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def attention(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        began = self._clock.now()
        out: torch.Tensor = self._ops.attention(*args, **kwargs)
        self._clock.seconds["attention"] += self._clock.now() - began
        return out
