"""`tokenmill bench swap` for a few seconds on a tiny model against the session broker: the
report's shape, that no request is lost and that the swap happened, never its timings (this
machine's speed is not under test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ops.bench.cli import bench

pytestmark = pytest.mark.slow

WINDOW_KEYS = {"count", "answered", "latency_ms", "span_s", "throughput_per_s", "models"}
SWAP_KEYS = {"load_ms", "smoke_ms", "flip_ms", "drained", "pause_ms", "command_to_swapped_ms"}


def bench_swap(bootstrap: str, model: Path, *extra: str) -> dict[str, Any]:
    """Run the command as a person would (in this process: no interpreter to start); its JSON
    report. It sends on until 5 requests went out after the swap, however long a busy machine
    makes the swap take."""
    args = [
        "swap", "--json", "--model", str(model), "--bootstrap-servers", bootstrap,
        "--duration", "6", "--swap-at", "0.3", "--rate", "10", "--max-new-tokens", "4",
        "--min-after", "5", "--timeout", "300", *extra,
    ]  # fmt: skip
    done = CliRunner().invoke(bench, args)
    assert done.exit_code == 0, done.output[-4000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def check_swapped_under_load(report: dict[str, Any]) -> dict[str, Any]:
    """Nothing lost or failed, a answered before the command and b after the swap; the swap."""
    assert {
        "config", "swap", "windows", "lost", "duplicates", "errors", "p99_during_over_before",
        "throughput_dip", "worker", "models", "host", "warnings",
    } <= set(report)  # fmt: skip
    assert report["lost"] == 0
    assert report["errors"] == {}
    assert report["duplicates"] == 0
    assert report["worker"]["exit_code"] == 0
    windows = report["windows"]
    assert set(windows) == {"before", "during", "after"}
    for window in windows.values():
        assert set(window) >= WINDOW_KEYS
        assert window["answered"] == window["count"]
    assert sum(w["count"] for w in windows.values()) == report["config"]["requests"] >= 60
    assert windows["before"]["models"].get("a", 0) > 0
    assert windows["after"]["count"] >= 5
    assert set(windows["after"]["models"]) == {"b"}
    swap = report["swap"]
    assert swap["outcome"] == "swapped"
    assert set(swap) >= SWAP_KEYS
    assert swap["to_model"]["name"] == "b"
    assert swap["digests_equal"]  # a and b are links to the same file
    return dict(swap)


def test_a_flip_under_load_loses_nothing(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path]
) -> None:
    report = bench_swap(kafka_bootstrap, tiny_checkpoints["llama"])

    swap = check_swapped_under_load(report)
    assert report["config"]["mode"] == "flip"
    assert not swap["drained"]
    assert swap["pause_ms"] == 0


def test_a_drain_mode_swap_under_load_loses_nothing(
    kafka_bootstrap: str, tiny_checkpoints: dict[str, Path]
) -> None:
    report = bench_swap(kafka_bootstrap, tiny_checkpoints["llama"], "--drain")

    swap = check_swapped_under_load(report)
    assert report["config"]["mode"] == "drain"
    assert swap["drained"]
    assert swap["pause_ms"] > 0
