"""Time the native quantized linear kernels against oneDNN's float32 product (a script, not a
test): SmolLM2-135M's shapes at 1, 2, 16 and 64 rows, and a whole batch-1 decode step.

    python -m ops.bench.qlinear_timing [--threads 2] [--trials 15] [--cpu-time]
        [--no-avx512]

Each figure is the median over `trials` of the mean time of a call in a trial; the variants of
one shape alternate trial by trial, so a noisy neighbour hits them all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from gpu.kernels.native import CpuKernels, cpu_kernels
from gpu.kernels.native_build import build, cache_dir, find_compiler
from gpu.models.packed_linear import PackedLinear
from gpu.quantized_weight import quantize_int4, quantize_int8

SHAPES = {  # name: (in, out)
    "qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576),
    "lm_head": (576, 49152),
}  # fmt: skip
ROWS = (1, 2, 16, 64)


def median_ms(
    calls: dict[str, Callable[[], object]], trials: int, clock: Callable[[], float]
) -> dict[str, float]:
    """Median per-call milliseconds of each callable, trials interleaved."""
    runs: dict[str, int] = {}
    for name, call in calls.items():
        call()
        start = clock()
        call()
        once = clock() - start
        runs[name] = max(1, int(0.01 / max(once, 1e-7)))  # ~10 ms a trial
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(trials):
        for name, call in calls.items():
            start = clock()
            for _ in range(runs[name]):
                call()
            samples[name].append((clock() - start) / runs[name] * 1e3)
    return {name: statistics.median(times) for name, times in samples.items()}


def int4_large_group(inputs: int) -> int:
    """128, or where it does not divide the inputs (576 = 4.5 · 128) the largest that does."""
    return next(g for g in (128, 64, 32) if inputs % g == 0)


def linear_table(kernels: CpuKernels, trials: int, clock: Callable[[], float]) -> None:
    print("shape      rows  fp32 oneDNN  int8 (ch)  int4 g32  int4 g128  (ms)")
    for name, (inputs, out) in SHAPES.items():
        w = torch.randn(out, inputs) * 0.05
        linear = nn.Linear(inputs, out, bias=False).requires_grad_(False)
        linear.weight.copy_(w)
        packed = PackedLinear(linear)
        large = int4_large_group(inputs)
        formats = {"int8": quantize_int8(w), "int4-g32": quantize_int4(w, 32),
                   f"int4-g{large}": quantize_int4(w, large)}  # fmt: skip
        for m in ROWS:
            x = torch.randn(m, inputs)
            calls: dict[str, Callable[[], object]] = {"fp32": partial(packed, x)}
            calls |= {label: partial(kernels.qlinear, x, q) for label, q in formats.items()}
            with torch.inference_mode():
                ms = median_ms(calls, trials, clock)
            figures = "  ".join(f"{ms[label]:9.3f}" for label in calls)
            note = "" if large == 128 else f"  (g{large}: 128 ∤ {inputs})"
            print(f"{name:9s} {m:4d}  {figures}{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trials", type=int, default=15)
    cpu_time = "time by this thread's CPU time (one thread only): steady on a busy machine"
    parser.add_argument("--cpu-time", action="store_true", help=cpu_time)
    parser.add_argument("--no-avx512", action="store_true", help="time the AVX2 build")
    args = parser.parse_args()
    if args.cpu_time and args.threads != 1:
        raise SystemExit("--cpu-time counts the calling thread alone: use --threads 1")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    avx2 = ("-mno-avx512f",)
    kernels = (
        build(find_compiler(), cache_dir() / "avx2", avx2) if args.no_avx512 else cpu_kernels()
    )
    if kernels is None:
        raise SystemExit("the native kernels did not build")
    linear_table(kernels, args.trials, clock)


if __name__ == "__main__":
    main()
