"""`bench startup`'s parts that need no broker: the probe run as the bench runs it (a fresh
interpreter), the worker's logged load time read back, the medians of rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ops.bench.startup import _logged, _medians

ROOT = Path(__file__).resolve().parents[4]
LOAD = ["load_checkpoint", "load_build", "load_weights", "load_kernels", "load_digest"]
PHASES = ["import_torch", "import_tokenmill", "resolve", *LOAD, "engine", "first_token", "total"]


def test_the_probe_times_each_phase_of_a_cold_start(tiny_checkpoints: dict[str, Path]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ops.bench.startup_probe", str(tiny_checkpoints["llama"])],
        capture_output=True, text=True, cwd=ROOT, check=True, timeout=300,
    )  # fmt: skip
    seconds = json.loads(out.stdout.strip().splitlines()[-1])

    assert list(seconds) == PHASES
    assert seconds["total"] >= sum(s for p, s in seconds.items() if p != "total") - 0.01


def test_the_worker_log_gives_its_load_time(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text(
        "not json\n"
        + json.dumps({"event": "worker_started"}) + "\n"
        + json.dumps({"event": "model_loaded", "seconds": 1.5, "phases": {"weights": 0.4}}) + "\n"
    )  # fmt: skip

    assert _logged(log, "model_loaded")["seconds"] == 1.5
    assert _logged(log, "model_swapped") == {}


def test_medians_of_rounds() -> None:
    rounds = [
        {"probe": {"total": t}, "generate_s": g, "worker": {"ready_s": r}}
        for t, g, r in [(2.0, 3.0, 4.0), (1.0, 2.5, 3.0), (3.0, 9.0, 3.5)]
    ]

    assert _medians(rounds) == {"probe": {"total": 2.0}, "generate_s": 3.0, "worker_ready_s": 3.5}
