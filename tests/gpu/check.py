"""The GPU check: the engine on CUDA against the CPU reference, then its decode benchmark.

    python3 tests/gpu/check.py --out gpu-check.json       # tests/gpu/run does this
    python3 tests/gpu/check.py --dry-run --out x.json     # on CPU, tiny models, a few steps

Phases, each recorded in the one JSON file it writes (rewritten after every phase, so a
killed run still leaves what it did) and each failing alone, the rest still running:

1. `correctness`: every tiny random model of `tests/tiny_models.py`, greedy, one prompt at a
   time, against the CPU float32 reference (`tests/gpu/correctness.py`).
2. `bench_smollm2_135m`: SmolLM2-135M in bfloat16, its GGUF when the tokenmill model cache
   holds it, else random weights of `configs/smollm2-135m.json`; 3. `bench_llama3_8b`: the
   Llama-3-8B-shaped random model (`configs/llama3-8b.json`) in bfloat16. Each: batch-1 decode
   step, its share of the copy-bandwidth roofline, batch 16 and 64 decode tokens/s
   (`ops/bench/gpu_decode.py`, loaded by path).

Then `targets`: each with its value and whether it is met. The whole run keeps to
`--budget-s` (each phase is cut off at what is left of it).

A GPU machine may have only python3 with torch, triton, transformers, safetensors,
tokenizers, jinja2 and numpy, and no network: this imports those (and what they import), the
standard library, the repo's `gpu/`, `messages/` and `tests/` code, and the pure-Python wheels
in `tests/gpu/wheels/` (gguf, for a GGUF checkpoint); never `ops/` or `actors/`
(`tests/unit/test_gpu_check.py` checks that with an import blocker).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path += [str(w) for w in sorted((HERE / "wheels").glob("*.whl"))]  # after site-packages

import torch  # noqa: E402  (the repo root goes on sys.path first)

from gpu.engine import Engine  # noqa: E402
from gpu.engine_config import EngineConfig  # noqa: E402
from gpu.loading.loader import LoadedModel, load_model  # noqa: E402
from gpu.loading.random_weights import load_random_model  # noqa: E402
from tests.gpu.correctness import PhaseTimeout, correctness  # noqa: E402

TARGETS = {  # name: (phase, path into its report, comparison, target)
    "smollm2_135m_batch1_step_ms": ("bench_smollm2_135m", ("batch1", "step_ms"), "<=", 1.0),
    "llama3_8b_bf16_batch1_roofline_fraction": (
        "bench_llama3_8b",
        ("batch1", "roofline_fraction"),
        ">=",
        0.60,
    ),
    "llama3_8b_bf16_batch64_tokens_per_s": (
        "bench_llama3_8b",
        ("batches", "64", "tokens_per_s"),
        ">=",
        8000.0,
    ),
}
SMOLLM2_GGUF = "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"


def gpu_decode() -> ModuleType:
    """`ops/bench/gpu_decode.py` by its path: the `ops` package (the CLI's dependencies) is
    never imported."""
    spec = importlib.util.spec_from_file_location(
        "tokenmill_gpu_decode", REPO / "ops" / "bench" / "gpu_decode.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# -- phases 2 and 3: the decode benchmark --------------------------------------------------


def _model_cache() -> Path:
    """Where `tokenmill models fetch` puts models (as ops/models/registry.py finds it)."""
    if explicit := os.environ.get("TOKENMILL_CACHE_DIR"):
        return Path(explicit) / "models"
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "tokenmill" / "models"
    return Path.home() / ".cache" / "tokenmill" / "models"


def bench(
    model: Callable[[], LoadedModel], source: dict[str, Any], options: Any, max_model_len: int
) -> dict[str, Any]:
    start = time.perf_counter()
    loaded = model()
    if loaded.device.type == "cuda":
        torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    engine = Engine(loaded, EngineConfig(max_model_len=max_model_len, max_num_seqs=64))
    report = gpu_decode().run_decode_roofline(engine, options)
    return {
        **source,
        "model": loaded.name,
        "parameters": loaded.config.num_parameters(),
        "load_s": load_s,
        "kv_blocks": engine.num_blocks,
        "report": report,
    }


def smollm2(device: torch.device, dtype: torch.dtype, dry_run: Path | None) -> Any:
    """The phase's loader and where its weights come from."""
    gguf = _model_cache() / SMOLLM2_GGUF
    if dry_run is None and gguf.is_file():
        source = {"weights": "checkpoint", "path": str(gguf)}
        return (lambda: load_model(gguf, dtype=dtype, device=device)), source
    config = dry_run / "smollm2-135m.json" if dry_run else HERE / "configs" / "smollm2-135m.json"
    source = {"weights": "random", "path": str(config), "checkpoint_looked_for": str(gguf)}
    return (lambda: load_random_model(config, dtype=dtype, device=device)), source


def llama3_8b(device: torch.device, dtype: torch.dtype, dry_run: Path | None) -> Any:
    config = dry_run / "llama3-8b.json" if dry_run else HERE / "configs" / "llama3-8b.json"
    source = {"weights": "random", "path": str(config)}
    return (lambda: load_random_model(config, dtype=dtype, device=device)), source


def shrunk_configs(folder: Path) -> Path:
    """The two benchmark configs at a tiny size, for a dry run on CPU (same architecture
    and rope settings, small shapes)."""
    from tests.tiny_models import tiny_config

    for name in ("smollm2-135m", "llama3-8b"):
        tiny_config(HERE / "configs" / f"{name}.json", folder / f"{name}.json")
    return folder


# -- the run -------------------------------------------------------------------------------


@contextmanager
def cut_off(seconds: float) -> Iterator[None]:
    """Raise PhaseTimeout in the body after `seconds`."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise PhaseTimeout(f"cut off after {seconds:.0f} s: the time budget is spent")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_phase(results: dict[str, Any], name: str, body: Callable[[], Any], deadline: float) -> None:
    left = deadline - time.monotonic()
    start = time.perf_counter()
    if left <= 0:
        results[name] = {"ok": False, "skipped": "the time budget was spent before this phase"}
        return
    try:
        with cut_off(left):
            results[name] = {"ok": True, **body()}
    except Exception as exc:  # recorded; the later phases still run
        results[name] = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=12),
        }
    results[name]["wall_s"] = round(time.perf_counter() - start, 3)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _lookup(report: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(report, dict) or key not in report:
            return None
        report = report[key]
    return float(report) if isinstance(report, (int, float)) else None


def targets(phases: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, (phase, path, comparison, target) in TARGETS.items():
        value = _lookup(phases.get(phase, {}).get("report"), path)
        met = None
        if value is not None:
            met = value <= target if comparison == "<=" else value >= target
        out[name] = {"target": target, "comparison": comparison, "value": value, "met": met}
    return out


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": str(device),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
    for name in ("transformers", "triton", "tokenizers", "safetensors", "numpy"):
        try:
            env[name] = str(importlib.import_module(name).__version__)
        except Exception as exc:  # absent or broken: say so, the check goes on
            env[name] = f"unavailable: {type(exc).__name__}"
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            gpu_memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
        )
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check.json"))
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="the whole run's limit")
    parser.add_argument("--archs", default=None, help="comma-separated tiny models (default: all)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="on CPU: one tiny model, the benchmarks on tiny configs, a few steps",
    )
    args = parser.parse_args(argv)
    from tests.tiny_models import ARCHS

    device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
    archs = tuple(args.archs.split(",")) if args.archs else (("llama",) if args.dry_run else ARCHS)
    decode = gpu_decode()
    options = decode.DecodeOptions(prompt_tokens=128, new_tokens=64, copy_repeats=10)
    max_model_len = 512
    if args.dry_run:
        options = replace(options, prompt_tokens=8, new_tokens=4, copy_repeats=2)
        max_model_len = 64
    started = time.time()
    deadline = time.monotonic() + args.budget_s
    result: dict[str, Any] = {
        "check": "tokenmill gpu check",
        "dry_run": args.dry_run,
        "device": str(device),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "budget_s": args.budget_s,
        "decode_options": {
            "prompt_tokens": options.prompt_tokens,
            "new_tokens": options.new_tokens,
            "batches": list(options.batches),
            "max_model_len": max_model_len,
        },
        "environment": environment(device),
        "phases": {},
    }
    phases = result["phases"]

    def write() -> None:
        result["targets"] = targets(phases)
        met = [t["met"] for t in result["targets"].values()]
        result["all_targets_met"] = None if None in met else all(met)
        result["correctness_ok"] = phases.get("correctness", {}).get("ok")
        result["wall_s"] = round(time.time() - started, 3)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))

    bf16 = torch.bfloat16
    with tempfile.TemporaryDirectory(prefix="tokenmill-gpu-configs-") as tmp:
        tiny = shrunk_configs(Path(tmp)) if args.dry_run else None
        bodies: list[tuple[str, Callable[[], Any]]] = [
            ("correctness", lambda: correctness(device, archs)),
            (
                "bench_smollm2_135m",
                lambda: bench(*smollm2(device, bf16, tiny), options, max_model_len),
            ),
            (
                "bench_llama3_8b",
                lambda: bench(*llama3_8b(device, bf16, tiny), options, max_model_len),
            ),
        ]
        for name, body in bodies:
            print(f"gpu check: {name}", file=sys.stderr, flush=True)
            run_phase(phases, name, body, deadline)
            write()
    print(f"gpu check: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
