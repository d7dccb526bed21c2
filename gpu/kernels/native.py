"""tokenmill's native CPU kernels (the C files beside this one), built once per host.

`cpu_kernels()` hands out this host's library: built on first use (`native_build.py`), bound
through ctypes (`CpuKernels`, `native_bindings.py`; the weight descriptor `TmWeight` in
`native_weight.py`).

Where there is no C compiler, or the build fails, `cpu_kernels()` logs one warning and
returns None: models then run PyTorch's ops alone (oneDNN-packed linears, SDPA over gathered
blocks), which give the same tokens, more slowly. `TOKENMILL_NATIVE_KERNELS=0` turns the
kernels off on purpose (no warning).
"""

from __future__ import annotations

import functools
import os

from gpu.kernels.native_bindings import CpuKernels as CpuKernels  # re-exported: callers ask here
from gpu.kernels.native_build import build, cache_dir, find_compiler
from gpu.kernels.native_weight import TmWeight as TmWeight  # re-exported: callers ask here
from gpu.kernels.native_weight import tm_weight as tm_weight  # re-exported: callers ask here

ENABLE_VARIABLE = "TOKENMILL_NATIVE_KERNELS"


@functools.cache
def cpu_kernels() -> CpuKernels | None:
    """This host's kernels, built on first use; None (one warning) where they cannot be."""
    if os.environ.get(ENABLE_VARIABLE, "1") == "0":
        return None
    return build(find_compiler(), cache_dir())
