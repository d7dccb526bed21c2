"""`tokenmill bench quant`'s figures against its fp32 row: ratios, the targets and whether each
is met, and a warning about a busy host. Pure functions of the report's rows."""

from __future__ import annotations

import os
from typing import Any

# issue "Quantized weights that stay quantized": ratios to fp32 in the same run
TARGETS = {  # name -> (scheme, figure, target, at_most)
    "int8_decode_vs_fp32": ("int8", "decode", 1.6, False),
    "int4_decode_vs_fp32": ("int4", "decode", 2.5, False),
    "int8_perplexity_vs_fp32": ("int8", "perplexity", 1.02, True),
}

RATIO_FIGURES = {  # ratio name -> the row's figure
    "weight_bytes": "weight_bytes",
    "loaded_bytes": "loaded_bytes",
    "decode": "decode_tokens_per_s",
    "batch": "batch_tokens_per_s",
    "perplexity": "perplexity",
}


def add_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured row with `vs_fp32`: its figures over the fp32 row's (None without one)."""
    base = next((r for r in rows if r.get("scheme") == "fp32" and "skipped" not in r), None)
    out = []
    for row in rows:
        if "skipped" in row:
            out.append(row)
            continue
        out.append({**row, "vs_fp32": {k: _ratio(row, base, k) for k in RATIO_FIGURES}})
    return out


def _ratio(row: dict[str, Any], base: dict[str, Any] | None, name: str) -> float | None:
    key = RATIO_FIGURES[name]
    value, reference = row.get(key), None if base is None else base.get(key)
    if value is None or not reference:
        return None
    return round(float(value) / float(reference), 4 if name == "perplexity" else 3)


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target's ratio in this run and whether it is met (None: not measured)."""
    ratios = {r["scheme"]: r.get("vs_fp32", {}) for r in add_ratios(rows)}
    out: dict[str, Any] = {}
    for name, (scheme, figure, target, at_most) in TARGETS.items():
        value = ratios.get(scheme, {}).get(figure)
        met = None if value is None else (value <= target if at_most else value >= target)
        out[name] = {
            "target": target,
            "at_most" if at_most else "at_least": True,
            "value": value,
            "met": met,
        }
    return out


def busy_host(report: dict[str, Any]) -> list[str]:
    """A warning when the 1-minute load average passed the usable CPUs at any point measured."""
    env, cpus = report["environment"], len(os.sched_getaffinity(0))
    loads = [env["host_load_1m_at_start"], env["host_load_1m_at_end"]]
    for model in report["models"]:
        loads += [x for row in model["rows"] for x in row.get("batch", {}).get("host_load_1m", [])]
    if any(x is not None and x > cpus for x in loads):
        return [
            f"the host's 1-minute load average passed its {cpus} CPUs (up to "
            f"{max(x for x in loads if x is not None)}): other work competed for them, so the "
            "rates and their ratios are noisy; with fewer free cores than threads, OpenMP's "
            "spinning threads slow steps many-fold (OMP_NUM_THREADS=1 is steadier there)"
        ]
    return []
