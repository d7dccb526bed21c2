"""Double-buffered model holder: an active engine that serves, a standby one beside it.

A swap loads the new model into the standby slot while the active one keeps serving, then
`flip()`s: the new model serves new requests, the old one moves to standby and finishes the
sequences it holds there. When it is idle it is either kept (so a rollback is another flip,
no load) or `release_standby()`d, which returns its device memory.

Pure bookkeeping: loading, smoke testing and deciding when to flip happen in the caller (the
GPU actor), which touches the holder only between engine steps.
"""

from __future__ import annotations

import gc
from typing import Any, Protocol

from gpu import host_heap


class HeldEngine(Protocol):
    """What the holder needs of an engine: its model's identity and whether it has work."""

    model: Any  # .name, .digest, .path

    def has_work(self) -> bool: ...


class ModelHolder:
    def __init__(self, active: HeldEngine) -> None:
        self.active: HeldEngine = active
        self.standby: HeldEngine | None = None

    def engines(self) -> list[HeldEngine]:
        """The loaded engines, active first."""
        return [self.active] if self.standby is None else [self.active, self.standby]

    def by_digest(self, digest: str) -> HeldEngine | None:
        return next((e for e in self.engines() if e.model.digest == digest), None)

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
        return self.active

    def replace_active(self, engine: HeldEngine) -> None:
        """Drain-mode swap: `engine` becomes active; the old one is dropped (the caller
        must hold no reference to it for its memory to come back)."""
        self.active = engine
        free_device_memory()

    def release_standby(self) -> None:
        """Drop the standby engine (it must be idle) and return its memory (the caller must
        hold no reference to it)."""
        if self.standby is None:
            return
        if self.standby.has_work():
            raise RuntimeError("the standby engine still runs sequences")
        self.standby = None
        free_device_memory()


def free_device_memory() -> None:
    """Collect dropped engines now and hand freed memory back: cached CUDA blocks to the
    driver, and on the host the C heap's free pages to the kernel (glibc keeps them)."""
    gc.collect()
    import torch  # here, so the holder's bookkeeping stays importable without a device

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    host_heap.trim()
