"""What an engine tells an attached observer about each step (`Engine.observe`).

Off the hot path: with no observer the engine tests one attribute per phase, and no model,
backend or kernel code knows observers exist. A step's phases, in order:

    schedule   the scheduler's decisions (admission, preemption, chunking)
    prepare    host lists → index tensors and attention metadata
    forward    the model's forward pass (or a whole-step fast path)
    sample     logits → tokens
    collect    the engine's bookkeeping after sampling (stop checks, completions)

An observer may also wrap the backend's layer operations (`wrap`), e.g. to time attention;
the engine hands the wrapped ops to the backend while the observer is attached.
"""

from __future__ import annotations

from typing import Protocol

from gpu.backends.layer_ops import LayerOps

PHASES = ("schedule", "prepare", "forward", "sample", "collect")


class StepObserver(Protocol):
    def step_began(self) -> None:
        """A step starts (its first phase starts now)."""
        ...

    def phase_done(self, phase: str) -> None:
        """`phase` (one of PHASES) ended now; the next one starts."""
        ...

    def step_done(self) -> None:
        """The step ended."""
        ...

    def wrap(self, ops: LayerOps) -> LayerOps:
        """The layer operations the backend uses while this observer is attached."""
        ...
