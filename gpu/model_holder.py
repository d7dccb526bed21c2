"""Double-buffered model holder: an active engine that serves, a standby one beside it.

A swap loads the new model into the standby slot while the active one keeps serving, then
`flip()`s: the new model serves new requests, the old one moves to standby and finishes the
sequences it holds there. When it is idle it is either kept (so a rollback is another flip,
no load) or `release_standby()`d, which returns its device memory.

Pure bookkeeping: loading, smoke testing and deciding when to flip happen in the caller (the
GPU actor), which touches the holder only between engine steps.
"""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path
from typing import Any, Protocol


class HeldEngine(Protocol):
    """What the holder needs of an engine: its model's identity and whether it has work."""

    model: Any  # .name, .digest, .path

    def has_work(self) -> bool: ...


class ModelHolder:
    def __init__(self, active: HeldEngine) -> None:
        self.active: HeldEngine = active
        self.standby: HeldEngine | None = None
        self.swaps = 0

    def engines(self) -> list[HeldEngine]:
        """The loaded engines, active first."""
        return [self.active] if self.standby is None else [self.active, self.standby]

    def by_digest(self, digest: str) -> HeldEngine | None:
        return next((e for e in self.engines() if e.model.digest == digest), None)

    def by_path(self, path: Path) -> HeldEngine | None:
        path = Path(path).resolve()
        return next((e for e in self.engines() if Path(e.model.path).resolve() == path), None)

    def install_standby(self, engine: HeldEngine) -> None:
        """Put a freshly loaded engine in the standby slot, which must be empty."""
        if self.standby is not None:
            raise RuntimeError("the standby slot is taken: release it first")
        self.standby = engine

    def flip(self) -> HeldEngine:
        """Make standby active; the old active becomes standby. Returns the new active."""
        if self.standby is None:
            raise RuntimeError("nothing in standby to flip to")
        self.active, self.standby = self.standby, self.active
        self.swaps += 1
        return self.active

    def replace_active(self, engine: HeldEngine) -> HeldEngine:
        """Drain-mode swap: `engine` becomes active; the old one is dropped. Returns it."""
        old, self.active = self.active, engine
        self.swaps += 1
        free_device_memory()
        return old

    def release_standby(self) -> HeldEngine | None:
        """Drop the standby engine (it must be idle) and return device memory."""
        engine = self.standby
        if engine is None:
            return None
        if engine.has_work():
            raise RuntimeError("the standby engine still runs sequences")
        self.standby = None
        free_device_memory()
        return engine


def free_device_memory() -> None:
    """Collect dropped engines now and hand freed memory back: cached CUDA blocks to the
    driver, and on the host the C heap's free pages to the kernel (glibc keeps them)."""
    gc.collect()
    import torch  # here, so the holder's bookkeeping stays importable without a device

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    _trim_host_heap()


def _trim_host_heap() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
