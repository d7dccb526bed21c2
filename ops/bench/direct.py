"""`bench pipeline`'s direct engine: the baseline the worker is measured against, built and
stepped on an engine thread of its own (as the worker's engine is), so its runs leave the
benchmark's event loop free. Each function here runs on that thread."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from gpu.engine import Engine, EngineRequest
from gpu.sequence import SamplingParams
from ops.bench.workload import BenchRequest
from ops.models.engine_options import EngineChoice
from ops.models.offline import run_all


def with_kv_pool_of(choice: EngineChoice, engine: Engine) -> EngineChoice:
    """`choice` with `engine`'s KV pool size: the worker's engine options. Planned from the
    memory left free, a second engine's pool could differ from the first's."""
    return replace(choice, engine=replace(choice.engine, num_kv_blocks=engine.num_blocks))


def engine_requests(workload: Sequence[BenchRequest], prefix: str) -> list[EngineRequest]:
    return [
        EngineRequest(
            f"{prefix}{i}", r.prompt_token_ids, SamplingParams(max_new_tokens=r.max_new_tokens)
        )
        for i, r in enumerate(workload)
    ]


def warm_direct(engine: Engine, warm: Sequence[BenchRequest]) -> None:
    """The warm-up workload, unmeasured, as the worker is sent it (`rounds.warm_up_workload`)."""
    with torch.inference_mode():
        run_all(engine, engine_requests(warm, "warm-"))


def direct_throughput(
    engine: Engine, workload: Sequence[BenchRequest], prefix: str
) -> dict[str, Any]:
    """The workload in one continuous batch: output tokens/s, and each request's tokens (to
    compare with the worker's). CPU seconds are metered by the caller, as for the worker."""
    with torch.inference_mode():
        start = time.perf_counter()
        run = run_all(engine, engine_requests(workload, prefix))
        wall = time.perf_counter() - start
    return {
        "requests": len(workload),
        "output_tokens": run.output_tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(run.output_tokens / wall, 2),
        "steps": len(run.steps),
        "tokens": [c.token_ids for c in run.completions],
    }


def direct_latency(engine: Engine, short: Sequence[BenchRequest]) -> list[float]:
    """`short`, one request at a time: each one's ms."""
    times = []
    with torch.inference_mode():
        for request in engine_requests(short, "direct-latency-"):
            start = time.perf_counter()
            run_all(engine, [request])
            times.append((time.perf_counter() - start) * 1e3)
    return times
