"""The pipeline benchmark's JSON report: its skeleton, the targets and whether each is met, and
warnings about a noisy host.

`ops/bench/pipeline.py` fills the skeleton's sections as it runs them, then adds `targets` and
`warnings` from what they measured.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import aiokafka
import torch

from actors.config import WorkerConfig
from ops.bench.broker import kafka_facts
from ops.bench.workload import host_load

if TYPE_CHECKING:
    from ops.bench.pipeline_run import PipelineOptions

TARGET_THROUGHPUT_RATIO = 0.95
TARGET_ADDED_P50_MS = 10.0
TARGET_CEILING_RPS = 10_000.0
WORKER_MODE = "subprocess: `tokenmill worker`, its own process (no GIL shared with the client)"


def skeleton(o: PipelineOptions, run_id: str) -> dict[str, Any]:
    """The report before any section runs: the environment and settings, every section skipped."""
    w = o.workload
    defaults = WorkerConfig()
    skipped = {"skipped": "not selected (--only)"}
    return {
        "benchmark": "pipeline",
        "run_id": run_id,
        "model": None,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "aiokafka": aiokafka.__version__,
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "torch_threads": torch.get_num_threads(),
            "host_load_1m_at_start": host_load(),
        },
        "kafka": {
            **kafka_facts(o.kafka is not None, o.kafka),  # bootstrap: set once the broker is up
            "partitions": o.partitions,
            "client": "aiokafka, acks=all, idempotent; linger 0 ms, 5 ms for the ceiling's floods",
        },
        "worker": {
            "mode": WORKER_MODE,
            "engine_options": asdict(o.engine.engine),
            "settings": {
                "max_wait_ms": defaults.max_wait_ms,
                "max_batch_size": defaults.max_batch_size,
                "max_batch_tokens": defaults.max_batch_tokens,
                "fetch_max_records": defaults.fetch_max_records,
                "emit_linger_ms": defaults.linger_ms,
                "high_watermark_requests": defaults.watermarks.high_requests,
            },
            "argv": {},
            "warm_up_s": {},
            "exit_code": {},
        },
        "workload": {
            "seed": w.seed,
            "requests": w.requests,
            "prompt_len_range": [w.min_prompt, w.max_prompt],
            "output_len_range": [w.min_output, w.max_output],
            "prompts": "uniform random token ids (bench engine's), sent as prompt_token_ids",
            "sampling": "greedy; EOS honoured on both paths (the wire has no ignore_eos)",
            **_model_seeds(o),
        },
        "sections": list(o.sections),
        "throughput": skipped,
        "latency": skipped,
        "ceiling": skipped,
        "tracing": skipped,
        "warnings": [],
    }


def _model_seeds(o: PipelineOptions) -> dict[str, Any]:
    """The seeds of the model sections' workloads (`PipelineOptions.round_specs` and the
    rest), for the sections that run."""
    seeds: dict[str, Any] = {}
    if "throughput" in o.sections:
        seeds["throughput_round_seeds"] = [spec.seed for spec in o.round_specs()]
    if {"throughput", "latency"} & set(o.sections):
        warm = o.warm_up_spec()
        seeds["warm_up"] = {"seed": warm.seed, "requests": warm.requests}
    if "latency" in o.sections:
        seeds["latency_seed"] = o.latency_spec().seed
    return seeds


def _target(value: float | None, target: float, *, at_most: bool = False) -> dict[str, Any]:
    met = None if value is None else (value <= target if at_most else value >= target)
    return {
        "target": target,
        "at_most" if at_most else "at_least": True,
        "value": value,
        "met": met,
    }


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """Each target, the value measured for it and whether it is met (None: not measured)."""
    ceiling = report["ceiling"]
    return {
        "throughput_ratio_vs_direct": _target(
            report["throughput"].get("ratio"), TARGET_THROUGHPUT_RATIO
        ),
        "latency_added_p50_ms": _target(
            report["latency"].get("added_ms", {}).get("p50"), TARGET_ADDED_P50_MS, at_most=True
        ),
        # Set for 2 cores with the broker on the same machine (see environment for this one's).
        "ceiling_requests_per_s": _target(
            ceiling.get("prompt_token_ids", {}).get("requests_per_s"), TARGET_CEILING_RPS
        ),
        "ceiling_text_requests_per_s": _target(
            ceiling.get("text_prompts", {}).get("requests_per_s"), TARGET_CEILING_RPS
        ),
    }


def warnings_for(report: dict[str, Any]) -> list[str]:
    """A warning when the host's load average passed its usable CPUs at any point measured."""
    env = report["environment"]
    cpus = env["cpus_usable"]
    loads = [env["host_load_1m_at_start"], env["host_load_1m_at_end"]]
    for section in report["sections"]:  # a section not selected has no loads
        loads += report[section].get("host_load_1m", [])
    if any(x is not None and x > cpus for x in loads):
        return [
            f"the host's 1-minute load average passed its {cpus} CPUs: other work competed for "
            "them, so wall-clock figures are noisy (cpu_s figures much less so)"
        ]
    return []
