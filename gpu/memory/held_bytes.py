"""What a loaded module holds in memory, counted from its tensors (no engine settings)."""

from __future__ import annotations

import torch


def module_bytes(model: torch.nn.Module) -> int:
    """A module's parameters and buffers: packed copies and quantized integers and scales
    included, tied weights once."""
    total = 0
    seen: set[int] = set()  # tied weights count once
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_mkldnn:  # a packed weight: its own opaque memory, never shared
            total += t.numel() * t.element_size()
        elif t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def weight_bytes(model: torch.nn.Module) -> int:
    """A module's weights as loaded: parameters and persistent buffers (quantized integers,
    scales and offsets), tied ones once; not the packed copies or tables such as RoPE's."""
    total = 0
    seen: set[int] = set()
    tensors: list[torch.Tensor] = list(model.parameters())
    for owner in model.modules():
        skip = owner._non_persistent_buffers_set
        tensors += [b for name, b in owner.named_buffers(recurse=False) if name not in skip]
    for t in tensors:
        if not t.is_mkldnn and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
