"""The swap benchmark's report: windows before, during and after the swap, the dip, warnings.

Pure functions over what `ops/bench/swap.py` recorded (`SwapRun`, `ResultLog`); see its
docstring for what each figure means.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from messages.events import Event, ModelSwapFailed, ModelSwapped, ModelSwapStarted
from messages.result import GenerateResult

if TYPE_CHECKING:
    from ops.bench.swap_run import ResultLog, Stamp, SwapRun

DIP_BIN_S = 1.0
DIP_AFTER_SWAP_S = 2.0
QUANTILES = {"p50": 50, "p99": 99, "max": 100}


def summarize(run: SwapRun, results: ResultLog) -> dict[str, Any]:
    """Windows, losses and the dip from what was sent, answered and the swap's events."""
    started = next((e for e in run.events if isinstance(e, ModelSwapStarted)), None)
    outcome = next((e for e in run.events if isinstance(e, ModelSwapped | ModelSwapFailed)), None)
    command_at = run.command_at if run.command_at is not None else math.inf
    swapped_at = outcome.at if isinstance(outcome, ModelSwapped) else math.inf
    arrived = {i: results.first[i] for i in run.sent if i in results.first}
    arrivals = sorted(stamp.unix for stamp, _ in arrived.values())
    # Throughput counts arrivals between the first one and the last send, within a window.
    steady = (arrivals[0] if arrivals else math.inf, run.load_span[1])
    bounds = {
        "before": (-math.inf, command_at),
        "during": (command_at, swapped_at),
        "after": (swapped_at, math.inf),
    }
    windows = {name: _window(run, arrived, arrivals, sent, steady) for name, sent in bounds.items()}
    errors = Counter(str(r.error.code) for _, r in arrived.values() if r.error is not None)
    before, during = windows["before"]["latency_ms"]["p99"], windows["during"]["latency_ms"]["p99"]
    return {
        "benchmark": "swap",
        "swap": _swap_fields(run, started, outcome),
        "windows": windows,
        "lost": len(run.sent) - len(arrived),
        "duplicates": sum(results.duplicates.values()),
        "errors": dict(errors),
        "p99_during_over_before": round(during / before, 3) if before and during else None,
        **_dip(arrivals, command_at, swapped_at, run.load_span[1], windows["before"]),
        "send_late_ms": {"p50": _pct(run.late_ms, 50), "max": _pct(run.late_ms, 100)},
        # Flat when the worker keeps up with the rate; rising when its queue grows.
        "before_p50_ms_by_half": _halves(run, arrived, command_at),
    }


def _halves(
    run: SwapRun, arrived: dict[str, tuple[Stamp, GenerateResult]], command_at: float
) -> list[float | None]:
    """p50 latency of the first and the second half of the before window, in send order."""
    latency = [
        (arrived[i][0].mono - sent.mono) * 1e3
        for i, sent in run.sent.items()
        if sent.unix < command_at and i in arrived
    ]
    middle = len(latency) // 2
    return [_pct(latency[:middle], 50), _pct(latency[middle:], 50)]


def _swap_fields(run: SwapRun, started: Event | None, outcome: Event | None) -> dict[str, Any]:
    def since_command(at: float | None) -> float | None:
        return None if at is None or run.command_at is None else round((at - run.command_at) * 1e3)

    fields: dict[str, Any] = {
        "command": "SwapModel(model='b.gguf')",
        "command_sent_at": run.command_at,  # just before send_command: includes its connect
        "command_to_started_ms": since_command(started.at if started else None),
    }
    match outcome:
        case ModelSwapped():
            return fields | {
                "outcome": "swapped",
                "from_model": msgspec.to_builtins(outcome.from_model),
                "to_model": msgspec.to_builtins(outcome.to_model),
                "digests_equal": outcome.from_model.digest == outcome.to_model.digest,
                "load_ms": round(outcome.load_ms, 1),
                "smoke_ms": round(outcome.smoke_ms, 1),
                "flip_ms": round(outcome.flip_ms, 3),
                "drained": outcome.drained,
                "pause_ms": round(outcome.pause_ms, 1),
                "command_to_swapped_ms": since_command(outcome.at),
            }
        case ModelSwapFailed():
            return fields | {"outcome": "failed", "reason": outcome.reason}
        case _:
            return fields | {"outcome": "no answer", "reason": "no model_swapped event in time"}


def _window(
    run: SwapRun,
    arrived: dict[str, tuple[Stamp, GenerateResult]],
    arrivals: Sequence[float],
    sent_in: tuple[float, float],
    steady: tuple[float, float],
) -> dict[str, Any]:
    """Requests sent in [start, end); results of any request arriving in it (within `steady`),
    per second."""
    start, end = sent_in
    ids = [i for i, sent in run.sent.items() if start <= sent.unix < end]
    answered = [arrived[i] for i in ids if i in arrived]
    latency = [(arrived[i][0].mono - run.sent[i].mono) * 1e3 for i in ids if i in arrived]
    start, end = max(start, steady[0]), min(end, steady[1])
    span = end - start if math.isfinite(end - start) and end > start else None
    in_span = sum(1 for t in arrivals if start <= t < end)
    models = Counter(_model_name(r) for _, r in answered)
    return {
        "count": len(ids),
        "answered": len(answered),
        "latency_ms": {key: _pct(latency, q) for key, q in QUANTILES.items()},
        "span_s": round(span, 3) if span is not None else None,
        "throughput_per_s": round(in_span / span, 3) if span else None,
        "models": dict(models),
    }


def _dip(
    arrivals: Sequence[float],
    command_at: float,
    swapped_at: float,
    load_end: float,
    before: dict[str, Any],
) -> dict[str, Any]:
    """The slowest 1-s bin of arrivals from the command to 2 s past the swap (within the load),
    over the before window's mean throughput."""
    end = min(swapped_at + DIP_AFTER_SWAP_S, load_end)
    mean = before["throughput_per_s"]
    if not (math.isfinite(command_at) and math.isfinite(end)) or not mean:
        return {"throughput_dip": None, "throughput_bins_per_s": []}
    bins = max(1, int((end - command_at) // DIP_BIN_S))
    counts = [0] * bins
    for t in arrivals:
        k = int((t - command_at) // DIP_BIN_S)
        if 0 <= k < bins:
            counts[k] += 1
    rates = [c / DIP_BIN_S for c in counts]
    return {"throughput_dip": round(min(rates) / mean, 3), "throughput_bins_per_s": rates}


def _model_name(result: GenerateResult) -> str:
    """The model file's stem: the worker names its first model by its --model argument (a
    path here), and a swapped-in one by its file's stem."""
    return Path(result.model.name).stem if result.model is not None else "none"


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if len(values) else None


def warnings_for(report: dict[str, Any]) -> list[str]:
    out = []
    cpu = report["cpu_s"]
    if cpu["other_processes"] is not None and cpu["other_processes"] > 0.25 * cpu["wall_s"]:
        out.append(
            f"other processes used {cpu['other_processes']} CPU seconds in the "
            f"{cpu['wall_s']} s of load: they competed with the worker"
        )
    if (late := report["send_late_ms"]["max"]) is not None and late > 100:
        out.append(f"a send went out {late} ms behind its schedule: the load was not steady")
    first, second = report["before_p50_ms_by_half"]
    if first is not None and second is not None and second > max(1.5 * first, first + 200):
        out.append(
            f"before the swap, p50 latency rose from {first} to {second} ms: the worker did not "
            "keep up with the rate, so every window measures a growing queue"
        )
    if report["lost"]:
        out.append(f"{report['lost']} requests had no result within the timeout")
    return out
