"""`bench swap`: one zero-downtime model swap under steady open-loop load (`tokenmill bench swap
--help`). Requests fall in windows by send time: `before` the command, `during` (until the
worker's `model_swapped` event) and `after`; windows and bins use unix times (the worker's
events carry them; same host), latency this process's monotonic clock."""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from actors.kafka.connection import KafkaConnection
from gpu.engine_config import EngineConfig
from messages.control import Command, Status, SwapModel
from messages.events import Event, ModelSwapFailed, ModelSwapped, ModelSwapStarted, StatusReply
from messages.request import GenerateRequest
from ops.bench.load import Arrival, Stamp, worker
from ops.bench.report import Narrate, Report, quiet, ratio
from ops.bench.rig import log_tail, rig
from ops.control.client import send_command
from ops.models.engine_options import EngineChoice
from ops.models.registry import resolve_model

ROLES = ("requests", "results", "dlq", "control", "events")


@dataclass(frozen=True)
class SwapBenchOptions:
    model: str = "smollm2-135m"  # an alias, a .gguf file or an HF folder: a and b link to it
    # At 3/s (16 new tokens) SmolLM2 on 2 CPUs kept both cores ~85% busy before the swap,
    # leaving the swap's load no room: 1.5 leaves about half of them to it.
    rate: float = 1.5
    duration_s: float = 45.0
    swap_at: float = 0.4  # share of duration_s at which the swap command goes out
    max_new_tokens: int = 16
    drain: bool = False
    kafka: KafkaConnection | None = None  # None: start a broker for this run
    timeout_s: float = 120.0  # per wait: the worker's start, the swap, the last results
    min_after: int = 0  # send on past duration_s until this many went out after the swap

    def __post_init__(self) -> None:
        if min(self.rate, self.duration_s, self.timeout_s) <= 0 or self.max_new_tokens < 1:
            raise ValueError("rate, duration, timeout and max_new_tokens must be positive")
        if not 0 < self.swap_at < 1:
            raise ValueError("swap_at must lie between 0 and 1 (a share of the duration)")

    @property
    def requests(self) -> int:
        return max(1, round(self.rate * self.duration_s))


@dataclass
class _Run:
    sent: dict[str, Stamp] = field(default_factory=dict)
    late_ms: list[float] = field(default_factory=list)
    command_at: float | None = None  # unix, just before `send_command`
    events: list[Event] = field(default_factory=list)  # those answering the swap command


def link_models(source: Path, models_dir: Path) -> str:
    """`a` and `b` in `models_dir` (`a.gguf`, `b.gguf` for a file), hard links to `source`'s
    files (else copies); how they were made."""
    how = "hard links"
    pairs = (
        [(source, Path(f"{n}.gguf")) for n in "ab"]
        if source.is_file()
        else [(f, Path(n) / f.name) for n in "ab" for f in source.iterdir() if f.is_file()]
    )
    for src, name in pairs:
        (models_dir / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, models_dir / name)
        except OSError:  # another filesystem, or links not allowed
            shutil.copyfile(src, models_dir / name)
            how = "copies"
    return how


async def run_swap_bench(o: SwapBenchOptions, say: Narrate = quiet) -> Report:
    """Run the load and the swap; the report (see `ops/bench/cli.py`)."""
    source = resolve_model(o.model)
    report = Report("swap")
    secret = secrets.token_hex(16)
    run = _Run()
    a, b = ("a.gguf", "b.gguf") if source.is_file() else ("a", "b")
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-swap-") as tmp:
        models_dir = Path(tmp) / "models"
        linked = link_models(source, models_dir)
        async with rig(o.kafka, Path(tmp), say, partitions=3) as r:
            report["kafka"] = r.facts()
            choice = EngineChoice(str(models_dir / a), None, None, EngineConfig())

            def request(i: int | str) -> GenerateRequest:
                prompt = f"Write one sentence about the number {i}."
                return GenerateRequest(
                    id=f"load-{i}", prompt=prompt, max_new_tokens=o.max_new_tokens
                )

            async def command(c: Command, answered: tuple[type, ...], wait_s: float) -> list[Event]:
                return await send_command(
                    r.kafka, c, secret=secret, control_topic=w.topics["control"],
                    events_topic=w.topics["events"], wait_s=wait_s,
                    until=lambda events: any(isinstance(e, answered) for e in events),
                )  # fmt: skip

            async def swap_later() -> None:
                await asyncio.sleep(o.swap_at * o.duration_s)
                run.command_at = time.time()
                answer = (ModelSwapped, ModelSwapFailed)
                run.events = await command(SwapModel(model=b), answer, o.timeout_s)

            async def load() -> None:
                deadline = time.monotonic() + o.duration_s + o.timeout_s
                more = lambda sent: _more_after(o, run, sent, deadline)  # noqa: E731
                run.sent, run.late_ms = await w.client.at_rate(request, o.rate, o.requests, more)

            say("worker: loading a, then a warm-up request and a status command")
            start = time.monotonic()
            budget = 1 if o.drain else None  # drain: no room for two models
            warm = [request("warm")]
            async with worker(
                r, "swap", choice, "torch", warm, o.timeout_s, roles=ROLES,
                models_dir=models_dir, control_secret=secret, swap_memory_budget_bytes=budget,
            ) as w:  # fmt: skip
                # A command sent before the control consumer has its positions is never seen.
                while not await command(Status(), (StatusReply,), 3.0):
                    if time.monotonic() - start > o.timeout_s or w.proc.returncode is not None:
                        raise RuntimeError(f"no answer to a status command:\n{log_tail(w.log)}")
                ready_s = round(time.monotonic() - start, 2)
                say(f"load: {o.rate}/s for {o.duration_s} s; swap to b at {o.swap_at:.0%}")
                meter = r.meter(w.proc).start()
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(load())
                    tg.create_task(swap_later())
                say("load: sent; waiting for the last results")
                await w.client.missing(run.sent.keys(), o.timeout_s)
                cpu = meter.read()
    shown = w.argv
    shown[shown.index("--control-secret") + 1] = "<random, for this run>"
    report["worker"] = {"argv": shown, "ready_s": ready_s, "exit_code": w.exit_code}
    report |= summarize(run, w.client.arrived, w.client.duplicates) | {"cpu_s": cpu}
    options = {f.name: getattr(o, f.name) for f in fields(o) if f.name != "kafka"}
    report["config"] = options | {
        "model_path": str(source),
        "mode": "drain" if o.drain else "flip",
        "requests": len(run.sent),
        "planned_requests": o.requests,
        "prompts": "text, 'Write one sentence about the number {i}.'; greedy",
    }
    report["models"] = {"linked_as": linked, "note": "a and b are links to the same bytes: b is "
                        "a real second load (another path, named b in results)"}  # fmt: skip
    if (late := report["send_late_ms"]["max"]) is not None and late > 100:
        report["warnings"].append(f"a send went {late} ms behind its schedule: an unsteady load")
    report.headline("swap", report["swap"], "outcome", "reason", "load_ms", "smoke_ms",
                    "flip_ms", "pause_ms", "command_to_swapped_ms")  # fmt: skip
    for name, w in report["windows"].items():
        report.headline(name, w, "count", "latency_ms", "throughput_per_s", "models")
    report.headline("losses", report, "lost", "duplicates", "errors", "throughput_dip")
    return report.finish()


def _more_after(o: SwapBenchOptions, run: _Run, sent: dict[str, Stamp], deadline: float) -> bool:
    """Send on: fewer than `min_after` went out after the swap was done, and the swap has not
    failed nor the extra time run out."""
    if o.min_after <= 0 or time.monotonic() > deadline:
        return False
    done = next((e for e in run.events if isinstance(e, ModelSwapped | ModelSwapFailed)), None)
    if isinstance(done, ModelSwapFailed):
        return False
    return done is None or sum(s.unix > done.at for s in sent.values()) < o.min_after


def summarize(run: _Run, arrived: dict[str, Arrival], duplicates: Counter[str]) -> dict[str, Any]:
    """Windows, losses and the dip from what was sent, answered and the swap's events."""
    started = next((e for e in run.events if isinstance(e, ModelSwapStarted)), None)
    outcome = next((e for e in run.events if isinstance(e, ModelSwapped | ModelSwapFailed)), None)
    command_at = run.command_at if run.command_at is not None else math.inf
    swapped_at = outcome.at if isinstance(outcome, ModelSwapped) else math.inf
    mine = {i: arrived[i] for i in run.sent if i in arrived}
    arrivals = sorted(a.at.unix for a in mine.values())
    load_end = max((s.unix for s in run.sent.values()), default=0.0)
    steady = (arrivals[0] if arrivals else math.inf, load_end)  # throughput counts arrivals here
    bounds = {"before": (-math.inf, command_at), "during": (command_at, swapped_at),
              "after": (swapped_at, math.inf)}  # fmt: skip
    windows = {k: _window(run, mine, arrivals, b, steady) for k, b in bounds.items()}
    before, during = windows["before"]["latency_ms"]["p99"], windows["during"]["latency_ms"]["p99"]
    # The slowest 1-s bin of arrivals from the command to 2 s past the swap, over before's mean.
    dip: dict[str, Any] = {"throughput_dip": None, "throughput_bins_per_s": []}
    end, mean = min(swapped_at + 2.0, load_end), windows["before"]["throughput_per_s"]
    if math.isfinite(command_at) and math.isfinite(end) and mean:
        bins = [0] * max(1, int(end - command_at))
        for t in arrivals:
            if 0 <= (k := int(t - command_at)) < len(bins):
                bins[k] += 1
        dip = {"throughput_dip": round(min(bins) / mean, 3), "throughput_bins_per_s": bins}
    return {
        "swap": _swap_fields(run, started, outcome),
        "windows": windows,
        "lost": len(run.sent) - len(mine),
        "duplicates": sum(duplicates[i] for i in run.sent),
        "errors": dict(Counter(str(a.result.error.code) for a in mine.values() if a.result.error)),
        "p99_during_over_before": ratio(during, before),
        **dip,
        "send_late_ms": _pct(run.late_ms, p50=50, max=100),
    }


def _swap_fields(run: _Run, started: Event | None, outcome: Event | None) -> dict[str, Any]:
    def since(at: float | None) -> float | None:
        return None if at is None or run.command_at is None else round((at - run.command_at) * 1e3)

    fields = {"command_sent_at": run.command_at,
              "command_to_started_ms": since(started.at if started else None)}  # fmt: skip
    match outcome:
        case ModelSwapped():
            return fields | {
                "outcome": "swapped",
                "from_model": msgspec.to_builtins(outcome.from_model),
                "to_model": msgspec.to_builtins(outcome.to_model),
                "digests_equal": outcome.from_model.digest == outcome.to_model.digest,
                "load_ms": round(outcome.load_ms, 1), "smoke_ms": round(outcome.smoke_ms, 1),
                "flip_ms": round(outcome.flip_ms, 3), "drained": outcome.drained,
                "pause_ms": round(outcome.pause_ms, 1), "command_to_swapped_ms": since(outcome.at),
            }  # fmt: skip
        case ModelSwapFailed():
            return fields | {"outcome": "failed", "reason": outcome.reason}
        case _:
            return fields | {"outcome": "no answer", "reason": "no model_swapped event in time"}


def _window(
    run: _Run, arrived: dict[str, Arrival], arrivals: Sequence[float],
    sent_in: tuple[float, float], steady: tuple[float, float],
) -> dict[str, Any]:  # fmt: skip
    """Requests sent in [start, end); results of any request arriving in it per second."""
    start, end = sent_in
    ids = [i for i, s in run.sent.items() if start <= s.unix < end]
    latency = [(arrived[i].at.mono - run.sent[i].mono) * 1e3 for i in ids if i in arrived]
    start, end = max(start, steady[0]), min(end, steady[1])
    span = end - start if math.isfinite(end - start) and end > start else None
    in_span = sum(1 for t in arrivals if start <= t < end)
    # The model's file or folder name: the worker names its first model by its --model path.
    refs = [arrived[i].result.model for i in ids if i in arrived]
    models = Counter(Path(ref.name).stem if ref is not None else "none" for ref in refs)
    return {
        "count": len(ids),
        "answered": len(latency),
        "latency_ms": _pct(latency, p50=50, p99=99, max=100),
        "span_s": round(span, 3) if span is not None else None,
        "throughput_per_s": round(in_span / span, 3) if span else None,
        "models": dict(models),
    }


def _pct(values: Sequence[float], **qs: float) -> dict[str, float | None]:
    """The named percentiles of `values`, to 0.1 (None where there are none)."""
    return {k: round(float(np.percentile(values, q)), 1) if len(values) else None
            for k, q in qs.items()}  # fmt: skip
