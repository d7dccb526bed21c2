"""device_memory: nothing to report, and no CUDA woken up, until CUDA is in use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu.memory.device_memory import device_memory

ROOT = Path(__file__).resolve().parents[4]
has_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: see the next test")
def test_on_cpu_it_reports_nothing_and_leaves_cuda_uninitialised() -> None:
    assert device_memory() == []
    assert not torch.cuda.is_initialized()  # type: ignore[no-untyped-call]


@has_cuda
def test_on_a_gpu_machine_it_does_not_initialise_cuda_either() -> None:
    # A fresh interpreter: in this one another test may have initialised CUDA already.
    code = (
        "import torch\n"
        "from gpu.memory.device_memory import device_memory\n"
        "assert device_memory() == []\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


@has_cuda
def test_with_cuda_in_use_every_visible_device_reports_its_bytes() -> None:
    held = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
    devices = device_memory()
    assert [d.device for d in devices] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    assert devices[0].allocated >= held.numel()
    assert all(d.reserved >= d.allocated for d in devices)
