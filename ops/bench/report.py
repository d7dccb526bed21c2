"""The one report every `tokenmill bench` command makes: a JSON-ready dict with the run's date,
host and commit, its figures, its targets (each met or not, never asserted), warnings about a
busy host, and a few headline lines for a person. `--out` writes it to a result file.

    report = Report("engine")
    report["contenders"] = {...}
    report.target("engine_vs_static", 7.4, 2.5)
    report.headline("engine", "583.9 tok/s")
    print(report.text())          # or report.json(); report.write(Path("docs/results"))
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Called with one line of text, such as "kafka: 64 requests at once"; the CLI prints to stderr.
Narrate = Callable[[str], None]
REPO = Path(__file__).resolve().parents[2]


def quiet(_: str) -> None:
    """A `Narrate` that says nothing."""


class Report(dict[str, Any]):
    """A benchmark's report: a dict (what the JSON holds: provenance, the host's load, targets,
    warnings and the benchmark's own sections), and headline lines for `text()` only."""

    def __init__(self, benchmark: str) -> None:
        super().__init__(benchmark=benchmark, **provenance())
        self["host_load_1m"] = [host_load()]
        self["targets"] = {}
        self["warnings"] = []
        self._headline: list[tuple[str, str]] = []

    def target(
        self, name: str, value: float | None, target: float, *, at_most: bool = False
    ) -> None:
        """Record a target and whether `value` meets it (None: not measured)."""
        met = None if value is None else (value <= target if at_most else value >= target)
        side = "at_most" if at_most else "at_least"
        self["targets"][name] = {"target": target, side: True, "value": value, "met": met}

    def headline(self, label: str, figures: str | dict[str, Any], *keys: str) -> None:
        """One line of the text form, the figures a person looks for first: a text, or those
        of `keys` (default all) in a dict, as "k v · k v"."""
        if isinstance(figures, dict):
            picked = [(k, figures[k]) for k in keys or figures if k in figures]
            figures = " · ".join(f"{k} {v}" for k, v in picked)
        self._headline.append((label, figures))

    def finish(self) -> Report:
        """The last load sample, and a warning when the host's load passed its CPUs."""
        loads = [x for x in [*self["host_load_1m"], host_load()] if x is not None]
        self["host_load_1m"] = loads
        cpus = len(os.sched_getaffinity(0))
        if loads and max(loads) > cpus:
            self["warnings"].append(
                f"the host's 1-minute load average reached {max(loads)} on {cpus} CPUs: other "
                "work competed for them, so wall-clock figures are noisy (CPU seconds less so)"
            )
        return self

    def json(self) -> str:
        return json.dumps(self, indent=2, ensure_ascii=False, default=str)

    def text(self) -> str:
        """A few lines for a person; the JSON holds everything."""
        host = self["host"]
        lines = [f"{self['benchmark']} · {self['date']} · {host['name']} ({host['cpus']} CPUs)"]
        width = max((len(label) for label, _ in self._headline), default=0)
        lines += [f"  {label:<{width}}  {text}" for label, text in self._headline]
        for name, t in self["targets"].items():
            verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
            sign = "≤" if t.get("at_most") else "≥"
            lines.append(f"  {name}: {t['value']} (target {sign} {t['target']}: {verdict})")
        lines += [f"  warning: {w}" for w in self["warnings"]]
        return "\n".join(lines)

    def write(self, out: Path) -> Path:
        """The JSON to `out` (a .json file), or into the folder `out` (made if need be) as
        `<date>-<benchmark>-<host>.json`."""
        if out.is_dir() or out.suffix != ".json":
            stamp = self["date"].replace(":", "").split("+")[0]
            out = out / f"{stamp}-{self['benchmark']}-{self['host']['name']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.json() + "\n")
        return out


def provenance() -> dict[str, Any]:
    """When, where and on what code a report was made."""
    import torch

    models: list[str] = []
    with contextlib.suppress(OSError):
        models = [s for s in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in s]
    head, dirty = _git("rev-parse", "--short", "HEAD"), _git("status", "--porcelain", "-uno")
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {
            "name": socket.gethostname(),
            "cpu": models[0].split(":", 1)[1].strip() if models else platform.processor() or None,
            "cpus": len(os.sched_getaffinity(0)),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        # with `-dirty` when the tree has uncommitted changes; None outside git
        "commit": head and (f"{head}-dirty" if dirty else head),
    }


def _git(*args: str) -> str | None:
    try:
        run = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                             timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip()


def host_load() -> float | None:
    """The 1-minute load average: above the CPU count, other work competed for the CPUs."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def percentiles(values: Sequence[float | None], qs: Sequence[int] = (50, 90, 99)) -> dict[str, Any]:
    """{"p50": …, "p90": …, "p99": …} of the values given (None where there are none)."""
    present = [v for v in values if v is not None]
    if not present:
        return {f"p{q}": None for q in qs}
    return {
        f"p{q}": round(float(v), 2) for q, v in zip(qs, np.percentile(present, qs), strict=True)
    }


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return round(a / b, digits) if a is not None and b else None


def significant(value: float, digits: int = 3) -> float:
    """`value` to `digits` significant digits: a tiny model's small rate stays above zero."""
    return float(f"{value:.{digits}g}")


def alternate(names: Sequence[str], repeats: int) -> list[str]:
    """Run order for comparing settings in one run: a, b, b, a, a, b, …, so that no setting
    always goes first and drift on a shared host falls on each alike."""
    return [n for i in range(repeats) for n in (names if i % 2 == 0 else names[::-1])]
