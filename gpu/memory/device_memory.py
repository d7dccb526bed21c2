"""How much accelerator memory this process holds, per CUDA device, as torch's allocator sees it.

Read only once CUDA is initialised (loading a model onto a GPU does that). Asking earlier would
initialise it — a context on the device, hundreds of MB — just to report zeros, and on a
machine without CUDA there is nothing to report: both give an empty list.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DeviceMemory", "device_memory"]


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    device: str  # "cuda:0": torch's numbering (after CUDA_VISIBLE_DEVICES)
    allocated: int  # bytes held by live tensors
    reserved: int  # bytes the caching allocator holds: allocated plus cached free blocks


def device_memory() -> list[DeviceMemory]:
    """Every visible CUDA device's allocated and reserved bytes; [] until CUDA is initialised."""
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # unannotated in torch
        return []
    # The allocator's counters: reading them creates no context on a device not yet used.
    return [
        DeviceMemory(
            f"cuda:{index}", torch.cuda.memory_allocated(index), torch.cuda.memory_reserved(index)
        )
        for index in range(torch.cuda.device_count())
    ]
