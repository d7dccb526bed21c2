"""Batch-1 decode and where a step's time goes, for `tokenmill bench engine`.

`batch1` runs one request alone (a seeded 128-token prompt, 128 new tokens, greedy, EOS
ignored: the peer benchmark's batch-1 case) twice: once bare, for the decode rate (tokens
after the first over the time after the first), and once with the engine's `StepClock`,
for the decode steps' breakdown (schedule, prepare, dense math, attention, sample, collect,
other). `timed` runs a workload with the clock on and returns the breakdown of every step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from gpu.engine import Engine, EngineRequest
from gpu.sequence import SamplingParams
from ops.bench.step_clock import StepClock
from ops.bench.workload import BenchOptions, make_workload

T = TypeVar("T")

BATCH1_PROMPT_TOKENS = 128
BATCH1_NEW_TOKENS = 128


def batch1(engine: Engine, options: BenchOptions) -> dict[str, Any]:
    """Decode tok/s and step ms of one request alone, and its decode steps' breakdown (a
    model shorter than 256 positions gets a prompt and output that fit)."""
    prompt = min(BATCH1_PROMPT_TOKENS, engine.max_model_len // 2)  # a small model's fit
    new = min(BATCH1_NEW_TOKENS, engine.max_model_len - prompt)
    single = dataclasses.replace(
        options, requests=1, min_prompt=prompt, max_prompt=prompt, min_output=new, max_output=new
    )
    (work,) = make_workload(engine, single)
    params = SamplingParams(max_new_tokens=work.max_new_tokens, ignore_eos=True)
    bare = _decode_steps(engine, EngineRequest("batch1", work.prompt_token_ids, params))
    clock = StepClock(engine.model.device)
    _decode_steps(engine, EngineRequest("batch1-timed", work.prompt_token_ids, params), clock)
    decode_s = sum(bare)
    return {
        "prompt_tokens": len(work.prompt_token_ids),
        "new_tokens": work.max_new_tokens,
        "decode_tokens_per_s": round(len(bare) / decode_s, 2) if decode_s else None,
        "decode_step_ms": round(decode_s / len(bare) * 1e3, 3) if bare else None,
        "breakdown": clock.breakdown(),
        # the decode steps ran as one native call (gpu/backends/native_decode_step.py), so
        # their attention is inside "dense"
        "one_native_call": getattr(engine.backend, "decode_step", None) is not None,
    }


def timed(engine: Engine, run: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """`run()` with the engine's step clock on; its result and every step's breakdown."""
    with _clocked(engine) as clock:
        result = run()
    return result, clock.breakdown()


def _decode_steps(
    engine: Engine, request: EngineRequest, clock: StepClock | None = None
) -> list[float]:
    """Run `request` alone; the seconds of each step after the one that gave its first token
    (the prefill). With `clock`, those decode steps are timed phase by phase."""
    engine.add(request)
    steps: list[float] = []
    try:
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


@contextmanager
def _clocked(engine: Engine) -> Iterator[StepClock]:
    clock = StepClock(engine.model.device)
    engine.observe(clock)
    try:
        yield clock
    finally:
        engine.observe(None)
