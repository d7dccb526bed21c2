"""How a worker's C heap (glibc malloc) serves its two kinds of large host allocation.

- **Weights** live as long as their model. glibc raises its mmap threshold as large blocks
  are freed, after which weights come from the heap arenas of the loading thread, and a
  swapped-out model leaves holes there that are not given back. Below a low fixed threshold
  every weight is a mapping of its own, returned to the kernel the moment it is freed.
- **A step's temporaries** (logits, activations, the decode step's work area: 1-13 MB each,
  every step) live a few milliseconds. Under the low threshold each one is a fresh mapping,
  unmapped when freed, so every step faults its pages in again and the kernel zeroes them.
  Measured on the bench workload (2 cores): ~2,100 mmap/munmap pairs in 12 s and ~4.7M minor
  page faults a run against ~0.8M, and the worker ran its engine at 0.62-0.80 of the plain
  engine's speed.

So a worker holds the threshold low only while it loads a model (`loading_weights()`), and
otherwise high, with a heap that keeps its freed top for the next step (`keep_step_memory()`
turns the policy on). `trim()` hands the heap's free pages back, after a swap frees a model.
Processes that never call `keep_step_memory()` keep glibc's defaults; everything here is a
no-op where the C library is not glibc.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator

LOAD_MMAP_THRESHOLD = 1 << 20  # while a model loads: weights of 1 MiB or more map alone
STEP_MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
STEP_TRIM_THRESHOLD = 512 << 20  # free heap top kept for the next step before trimming

_M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_policy_on = False
_loads = 0  # loads in progress (the first one lowers the threshold, the last raises it)


def keep_step_memory() -> bool:
    """Turn the worker's policy on: from now on the heap keeps step temporaries, and
    `loading_weights()` maps weights alone. Call once at start-up; False if not glibc."""
    global _policy_on
    libc = _glibc()
    if libc is None:
        return False
    with _lock:
        _policy_on = True
        if _loads == 0:
            _set_step_mode(libc)
    return True


@contextlib.contextmanager
def loading_weights() -> Iterator[None]:
    """While inside (on any thread), allocations of `LOAD_MMAP_THRESHOLD` or more are
    mappings of their own. Loads may overlap; steps that run meanwhile only map their
    temporaries too (slower for the length of the load, not wrong)."""
    global _loads
    libc = _glibc()
    if libc is None or not _policy_on:
        yield
        return
    with _lock:
        _loads += 1
        if _loads == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _loads -= 1
            if _loads == 0:
                _set_step_mode(libc)


def trim() -> None:
    """Hand the heap's free pages back to the kernel (glibc otherwise keeps them)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def mapped_bytes() -> int | None:
    """Bytes the heap serves from mappings of their own (glibc's `hblkhd`); None if unknown."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):  # glibc before 2.33
        return None
    return int(libc.mallinfo2().hblkhd)


def _set_step_mode(libc: ctypes.CDLL) -> None:
    libc.mallopt(_M_MMAP_THRESHOLD, STEP_MMAP_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, STEP_TRIM_THRESHOLD)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.malloc_trim  # noqa: B018  # glibc only
            libc.mallopt  # noqa: B018
        except (OSError, AttributeError):  # not glibc
            return None
        if hasattr(libc, "mallinfo2"):
            libc.mallinfo2.restype = _MallInfo2
        _libc = libc
    return _libc
