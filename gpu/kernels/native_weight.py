"""weight.h's weight descriptor in ctypes: `TmWeight`, and `tm_weight` making one from a float32
or quantized weight, with the check every native kernel makes of its float32 tensors."""

from __future__ import annotations

import ctypes

import torch

from gpu.quantized_weight import QuantizedWeight

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p
INPUT_MULTIPLE = 16  # weight.h: input features and groups are multiples of 16


class TmWeight(ctypes.Structure):
    """weight.h's `tm_weight`: a weight matrix [out, in] as the kernels read it (bits 32: a
    float32 matrix, and its panels or NULL; 8, 4: gpu/quantized_weight.py's layout). Raw addresses:
    whoever holds one keeps the tensors it points into alive."""

    _fields_ = (
        ("bits", _i64),
        ("group", _i64),
        ("data", _ptr),
        ("scales", _ptr),
        ("offsets", _ptr),
        ("panels", _ptr),
    )


def tm_weight(
    weight: torch.Tensor | QuantizedWeight,
    first_row: int = 0,
    panels: torch.Tensor | None = None,  # a float weight's `CpuKernels.pack_panels`
) -> TmWeight:
    """The descriptor of `weight` (float32 [out, in] or quantized, contiguous, on the CPU) from
    row `first_row` on (gate_up's second half is its rows from `inter`); a float weight's
    panels from the panel of that row on (`first_row` a multiple of the panel width)."""
    if weight.device.type != "cpu":
        raise ValueError(f"native kernels take CPU weights, not {weight.device}")
    if isinstance(weight, torch.Tensor):
        if weight.dtype != torch.float32 or weight.dim() != 2 or not weight.is_contiguous():
            raise ValueError("a float weight must be a contiguous float32 [out, in] matrix")
        skip = first_row * weight.stride(0) * weight.element_size()
        held = None
        if panels is not None:
            check_float32(panels)
            width = panels.shape[2]
            if first_row % width or panels.shape[1] != weight.shape[1]:
                raise ValueError(f"panels {tuple(panels.shape)} from row {first_row}")
            held = panels.data_ptr() + first_row // width * panels.stride(0) * 4
        return TmWeight(32, weight.shape[1], weight.data_ptr() + skip, None, None, held)
    if weight.in_features % INPUT_MULTIPLE or weight.group % INPUT_MULTIPLE:
        raise ValueError(
            f"{weight.scheme} with {weight.in_features} inputs: the kernels take inputs and "
            f"groups in multiples of {INPUT_MULTIPLE}"
        )
    data, scales, offsets = weight.data, weight.scales, weight.offsets
    row_bytes = scales.shape[1] * 4  # of a row's scales (and of its offsets)
    return TmWeight(
        weight.bits,
        weight.group,
        data.data_ptr() + first_row * data.stride(0) * data.element_size(),
        scales.data_ptr() + first_row * row_bytes,
        None if offsets is None else offsets.data_ptr() + first_row * row_bytes,
    )


def check_float32(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"native kernels take contiguous float32 CPU tensors, got {t.dtype}")
