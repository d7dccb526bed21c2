"""tests/gpu/check.py runs with what a GPU machine has: no `ops/`, no CLI dependencies.

Each test runs the check in a child interpreter behind an import blocker: a `sys.meta_path`
finder, in PathFinder's place, that finds no top-level package outside the standard library,
the GPU machine's packages (torch, triton, transformers, safetensors, tokenizers, jinja2,
numpy) and what they require, and the repo's own gpu/, messages/ and tests/; gguf is served
only from the wheel vendored under tests/gpu/wheels/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "tests" / "gpu" / "check.py"

BLOCKER = r"""
import importlib.machinery, importlib.metadata as md, json, re, sys

MACHINE = {"torch", "triton", "transformers", "safetensors", "tokenizers", "jinja2", "numpy"}
OWN = {"gpu", "messages", "tests"}  # the repo's; never ops or actors
WHEELS = [str(w) for w in sorted(__import__("pathlib").Path(sys.argv[1]).glob("*.whl"))]
SERVED = {"gguf"}  # from WHEELS only

def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def closure(roots):
    seen, todo = set(), [canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            todo.append(canonical(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]))
    return seen

dists = closure(MACHINE)
tops = {
    top for top, names in md.packages_distributions().items()
    if any(canonical(d) in dists for d in names)
}
ALLOWED = tops | set(sys.stdlib_module_names) | OWN | {"__main__"}
blocked = []

# In PathFinder's place: a refused package is not found, as if not installed (so
# `importlib.util.find_spec` probes see None and imports raise ModuleNotFoundError).
class Blocker:

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in SERVED:
            return importlib.machinery.PathFinder.find_spec(name, path if "." in name else WHEELS)
        if top in ALLOWED or top.startswith("_sysconfigdata_"):
            return importlib.machinery.PathFinder.find_spec(name, path, target)
        blocked.append(name)
        return None

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()

    def find_distributions(self, *args, **kwargs):  # metadata stays readable
        return importlib.machinery.PathFinder.find_distributions(*args, **kwargs)

sys.meta_path[:] = [
    Blocker() if f is importlib.machinery.PathFinder else f for f in sys.meta_path
]
sys.argv = sys.argv[2:]
code = None
try:
    source = open(sys.argv[0]).read()
    exec(compile(source, sys.argv[0], "exec"), {"__name__": "__main__", "__file__": sys.argv[0]})
except SystemExit as exc:
    code = exc.code
loaded = sorted({m.partition(".")[0] for m in sys.modules})
print("BLOCKER-REPORT " + json.dumps({
    "code": code, "blocked": blocked, "loaded": loaded,
    "gguf": getattr(sys.modules.get("gguf"), "__file__", None),
}))
"""


def _blocked_run(script: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run `script` with `args` behind the blocker; its report (exit code, blocked and
    loaded top-level modules)."""
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, str(REPO / "tests" / "gpu" / "wheels"), str(script), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BLOCKER-REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    report: dict[str, Any] = json.loads(lines[-1].removeprefix("BLOCKER-REPORT "))
    return report


def _no_cli_packages(report: dict[str, Any]) -> None:
    for name in ("ops", "actors", "msgspec", "llguidance", "structlog", "click", "aiokafka"):
        assert name not in report["loaded"], name
    assert not [b for b in report["blocked"] if b.partition(".")[0] in ("ops", "actors")]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path_factory.mktemp("gpu-check") / "gpu-check.json"
    report = _blocked_run(CHECK, "--dry-run", "--out", str(out))
    return report, json.loads(out.read_text())


def test_the_check_runs_behind_the_import_blocker(
    dry_run: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    report, _ = dry_run
    assert report["code"] == 0
    _no_cli_packages(report)
    assert {"torch", "gpu", "tests"} <= set(report["loaded"])


def test_dry_run_writes_every_phase_and_target(
    dry_run: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, result = dry_run
    assert result["dry_run"] is True and result["device"] == "cpu"
    assert set(result["phases"]) == {"correctness", "bench_smollm2_135m", "bench_llama3_8b"}
    for name, phase in result["phases"].items():
        assert phase["ok"] is True, (name, phase.get("error"), phase.get("traceback"))
        assert phase["wall_s"] >= 0
    llama = result["phases"]["correctness"]["models"]["llama"]
    assert llama["float32"]["tokens_equal"] is True  # CPU against CPU: the same computation
    assert 0 <= llama["bfloat16"]["greedy_agreement"] <= 1
    assert llama["bfloat16"]["logits_max_abs_diff"] >= 0
    own = llama["bfloat16"]["transformers_bf16"]  # the dtype's own distance, for comparison
    assert 0 <= own["greedy_agreement"] <= 1 and own["logits_max_abs_diff"] >= 0
    assert set(result["targets"]) == {
        "smollm2_135m_batch1_step_ms",
        "llama3_8b_bf16_batch1_roofline_fraction",
        "llama3_8b_bf16_batch64_tokens_per_s",
    }
    for target in result["targets"].values():
        assert set(target) == {"target", "comparison", "value", "met"}
        assert target["value"] > 0 and isinstance(target["met"], bool)
    assert isinstance(result["all_targets_met"], bool) and result["correctness_ok"] is True
    for name in ("bench_smollm2_135m", "bench_llama3_8b"):
        bench = result["phases"][name]
        assert bench["weights"] == "random"  # a dry run never loads a checkpoint
        section = bench["report"]
        assert section["timer"] == "perf_counter"
        assert set(section["batches"]) == {"16", "64"}
        assert section["batch1"]["roofline_fraction"] > 0


def test_a_failing_phase_is_recorded_and_the_rest_run(tmp_path: Path) -> None:
    # No such tiny model: correctness records the error, the benchmarks still run.
    out = tmp_path / "gpu-check.json"
    report = _blocked_run(CHECK, "--dry-run", "--archs", "no_such_arch", "--out", str(out))
    assert report["code"] == 0
    result = json.loads(out.read_text())
    correctness = result["phases"]["correctness"]
    assert correctness["ok"] is False and "no_such_arch" in correctness["models"]
    assert "error" in correctness["models"]["no_such_arch"]
    assert result["phases"]["bench_llama3_8b"]["ok"] is True
    assert result["correctness_ok"] is False


def test_gguf_comes_from_the_vendored_wheel(tmp_path: Path) -> None:
    script = tmp_path / "gguf_import.py"
    script.write_text(  # the check's module code (its sys.path), then the GGUF reader
        f"import runpy\nrunpy.run_path({str(CHECK)!r}, run_name='check')\nimport gpu.loading.gguf\n"
    )
    report = _blocked_run(script)
    assert report["gguf"] is not None and "tests/gpu/wheels/gguf-" in report["gguf"]
    _no_cli_packages(report)


def test_bf16_is_close_within_the_tolerance_or_transformers_own_distance() -> None:
    """A router flip moves transformers' bfloat16 as far as tokenmill's: that passes; a
    distance beyond both the tolerance and the dtype's own does not."""
    from tests.gpu.correctness import BF16_TOLERANCE, DTYPE_MARGIN, bf16_close

    def summary(diff: float | None, scale: float | None = 3.3) -> dict[str, Any]:
        return {"logits_max_abs_diff": diff, "logits_scale": scale}

    tolerated = BF16_TOLERANCE * 3.3
    assert bf16_close(summary(tolerated * 0.9), summary(0.0)) is True
    assert bf16_close(summary(tolerated * 2), summary(0.02)) is False
    assert bf16_close(summary(0.40), summary(0.40 / DTYPE_MARGIN)) is True  # Qwen3-MoE's case
    assert bf16_close(summary(None, None), summary(0.1)) is None  # the forward was not seen
