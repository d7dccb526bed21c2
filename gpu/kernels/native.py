"""tokenmill's native CPU kernels (the C files beside this one), built once per host.

`cpu_kernels()` hands out this host's library: built on first use (`native_build.py`), bound
through ctypes (`CpuKernels`, `native_bindings.py`; the weight descriptor `TmWeight` in
`native_weight.py`).

Where there is no C compiler, or the build fails, `cpu_kernels()` logs one warning and
returns None: models then run PyTorch's ops alone (oneDNN-packed linears, SDPA over gathered
blocks), which give the same tokens, more slowly. `TOKENMILL_NATIVE_KERNELS=0` turns the
kernels off on purpose (no warning).

`TOKENMILL_KERNEL_ISA` picks the vector path the library is built for: `native` (the default:
what the host has), `avx2` (AVX-512 left out: to measure an AVX2 host's path on an AVX-512
one) or `plain` (no vector intrinsics).
"""

from __future__ import annotations

import functools
import os
import platform

from gpu.kernels.native_bindings import CpuKernels as CpuKernels  # re-exported: callers ask here
from gpu.kernels.native_build import build, cache_dir, find_compiler
from gpu.kernels.native_weight import TmWeight as TmWeight  # re-exported: callers ask here
from gpu.kernels.native_weight import tm_weight as tm_weight  # re-exported: callers ask here

ENABLE_VARIABLE = "TOKENMILL_NATIVE_KERNELS"
ISA_VARIABLE = "TOKENMILL_KERNEL_ISA"
# The vector paths a build can take, as compiler flags added to -march=native
KERNEL_ISAS: dict[str, tuple[str, ...]] = {
    "native": (),
    "avx2": ("-mno-avx512f",),
    "plain": ("-mno-avx512f", "-mno-avx2", "-mno-fma"),
}


@functools.cache
def cpu_kernels() -> CpuKernels | None:
    """This host's kernels, built on first use; None (one warning) where they cannot be."""
    if os.environ.get(ENABLE_VARIABLE, "1") == "0":
        return None
    return build(find_compiler(), cache_dir(), isa_flags(os.environ.get(ISA_VARIABLE)))


def isa_flags(isa: str | None) -> tuple[str, ...]:
    """The compiler flags of a `TOKENMILL_KERNEL_ISA` value (None: the host's own path)."""
    if isa is None or isa == "":
        return ()
    if isa not in KERNEL_ISAS:
        raise ValueError(f"{ISA_VARIABLE}={isa!r}: expected one of {', '.join(KERNEL_ISAS)}")
    if isa != "native" and platform.machine() not in ("x86_64", "AMD64"):
        raise ValueError(f"{ISA_VARIABLE}={isa}: the vector paths to choose from are x86's")
    return KERNEL_ISAS[isa]
