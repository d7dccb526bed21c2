"""Device and dtype defaults: CUDA in bfloat16 when present, else CPU in float32.

bf16 matmuls are slow on most CPUs (no native support), so the CPU default is float32.
"""

from __future__ import annotations

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def parse_device(name: str) -> torch.device:
    """A device this machine has, or ValueError saying why not."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r} (use cpu, cuda or cuda:N)") from exc
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError("no CUDA device is available here (use --device cpu)")
        if device.index is not None and device.index >= count:
            raise ValueError(f"cuda:{device.index} does not exist; this machine has {count}")
    elif device.type != "cpu":
        raise ValueError(f"unsupported device {name!r} (use cpu, cuda or cuda:N)")
    return device


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
