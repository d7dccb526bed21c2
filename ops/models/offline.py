"""Run a set of requests through an engine to completion (CLI, benchmarks, tests)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpu.engine import Completion, Engine, EngineRequest, StepStats


@dataclass
class OfflineRun:
    completions: list[Completion]  # in request order
    steps: list[StepStats] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        if not self.steps:
            return 0.0
        return (self.steps[-1].end_ns - self.steps[0].start_ns) / 1e9

    @property
    def output_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.completions)


def run_all(engine: Engine, requests: Iterable[EngineRequest]) -> OfflineRun:
    """Add every request (all in one continuous batch), step until done, keep input order."""
    order = []
    for request in requests:
        engine.add(request)
        order.append(request.request_id)
    done: dict[str, Completion] = {}
    steps: list[StepStats] = []
    while engine.has_work():
        out = engine.step()
        steps.append(out.stats)
        for completion in out.finished:
            done[completion.request_id] = completion
    return OfflineRun([done[i] for i in order], steps)
