"""`bench pipeline --only exactly_once`: the cost of `--exactly-once`. Echo workers (the worst
case: no model, so the per-request work around the engine is all there is), each flooded and
then sent a light stream, and workers on the model, flooded; without and with exactly-once, in
alternating rounds on fresh workers. Results are read as a read_committed consumer reads them
(transactional results arrive when their transaction commits). Reported: requests/s and their
ratio (target ≥ 0.9), and the result latency exactly-once adds at p50 and p99."""

from __future__ import annotations

import statistics
from typing import Any

from messages.request import GenerateRequest
from ops.bench.load import flood, latency, worker
from ops.bench.report import alternate
from ops.bench.rig import Rig

# `o` below is `bench pipeline`'s PipelineOptions, not imported: pipeline imports this module.

TARGET_THROUGHPUT_RATIO = 0.9
LATENCY_RATE = 20.0  # requests/s: light, a request seldom waits behind another


async def exactly_once_section(r: Rig, o: Any) -> dict[str, Any]:
    """Requests/s and latency at a light rate, at-least-once and exactly-once: echo workers,
    then workers on the model (its engine time dilutes the transactions' cost)."""
    p = o.echo_prompt_tokens
    prompts = [[(i * 31 + k) % 250 + 3 for k in range(p)] for i in range(o.exactly_once_requests)]
    report = await _alternate(r, o, "echo", prompts, p, warm=500, light=o.latency_requests)
    report["engine"] = "echo (no model: the per-request work around the engine is all)"
    if o.exactly_once_model_requests:
        model = prompts[: o.exactly_once_model_requests]
        report["model"] = await _alternate(
            r, o, "torch", model, o.latency_max_new_tokens, warm=2, light=0
        )
        report["model"]["engine"] = f"{o.engine.model} ({o.engine.device})"
    return report


async def _alternate(
    r: Rig, o: Any, kind: str, prompts: list[list[int]], new_tokens: int, *, warm: int,
    light: int,
) -> dict[str, Any]:  # fmt: skip
    """`exactly_once_rounds` × (without, with) floods of one workload, each on a fresh worker,
    then `light` requests at `LATENCY_RATE`."""
    n = len(prompts)
    runs: dict[str, list[dict[str, Any]]] = {"at_least_once": [], "exactly_once": []}
    for i, mode in enumerate(alternate(tuple(runs), o.exactly_once_rounds)):
        name = f"eos-{kind}-{mode}-{i // 2}"

        def requests(tag: str, count: int, name: str = name) -> list[GenerateRequest]:
            return [
                GenerateRequest(
                    id=f"{name}-{tag}-{j}",
                    prompt_token_ids=prompts[j % n],
                    max_new_tokens=new_tokens,
                )
                for j in range(count)
            ]

        env = {"TOKENMILL_EXACTLY_ONCE": "true"} if mode == "exactly_once" else {}
        r.say(f"{mode}, {kind} (round {i // 2 + 1}): {n} requests")
        warming = requests("warm", warm)
        async with worker(r, name, o.engine, kind, warming, o.timeout_s, env=env, linger_ms=5) as w:
            run = await flood(w.client, requests("flood", n), r.meter(w.proc), o.timeout_s)
            if light:
                run["latency_at_light_rate"] = await latency(
                    w.client, requests("light", light), LATENCY_RATE, o.timeout_s
                )
            runs[mode].append(run)
    rates = {m: [x["requests_per_s"] for x in xs if x["requests_per_s"]] for m, xs in runs.items()}
    off, on = rates["at_least_once"], rates["exactly_once"]
    ratio = round(statistics.mean(on) / statistics.mean(off), 3) if off and on else None
    # Each round's own ratio: one flood slowed by the host (a JIT, a GC, a neighbour) moves
    # the mean; the median of the rounds says what most of them saw.
    by_round = [round(b / a, 3) for a, b in zip(off, on, strict=False)]
    added: dict[str, float | None] = {}
    for q in ("p50", "p99"):
        base = _mean(runs["at_least_once"], q)
        eos = _mean(runs["exactly_once"], q)
        added[q] = None if base is None or eos is None else round(eos - base, 2)
    return {
        "rounds": o.exactly_once_rounds, "requests": n, "new_tokens": new_tokens,
        "at_least_once": runs["at_least_once"], "exactly_once": runs["exactly_once"],
        "requests_per_s": rates, "ratio_exactly_once_vs_at_least_once": ratio,
        "ratio_by_round": by_round,
        "ratio_median_of_rounds": statistics.median(by_round) if by_round else None,
        "cpu_ms_per_request": {m: _cpu_per_request(xs) for m, xs in runs.items()},
        "latency_rate_per_s": LATENCY_RATE if light else None,
        "latency_added_ms": added if light else None,
        "target_ratio_at_least": TARGET_THROUGHPUT_RATIO,
        "met": None if ratio is None else ratio >= TARGET_THROUGHPUT_RATIO,
    }  # fmt: skip


def _mean(runs: list[dict[str, Any]], q: str) -> float | None:
    values = [
        x["latency_at_light_rate"]["end_to_end_ms"][q] for x in runs if "latency_at_light_rate" in x
    ]
    return None if not values or None in values else round(statistics.mean(values), 2)


def _cpu_per_request(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean CPU milliseconds per flooded request, by process: less noisy than wall time on a
    shared host (the broker's share is what transactions add there)."""
    out: dict[str, float | None] = {}
    for who in ("worker", "broker"):
        ms = [1000 * x["cpu_s"][who] / x["requests"] for x in runs if x["cpu_s"].get(who)]
        out[who] = round(statistics.mean(ms), 3) if ms else None
    return out
