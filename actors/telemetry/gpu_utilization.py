"""How busy each GPU is, from NVML (the library behind nvidia-smi), for `/metrics`.

NVML ships with the NVIDIA driver. Where there is none, or `pynvml` is not installed,
`nvmlInit` fails once: the sampler remembers it, logs it once and returns nothing from then
on, so a scrape never pays for a retry. A device whose own call fails is left out of that
sample; the others still report.

Devices are NVML's (nvidia-smi's) numbering, which need not be torch's `cuda:N`: torch orders
devices fastest first and after `CUDA_VISIBLE_DEVICES`, NVML by PCI bus and sees them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import structlog

__all__ = ["GpuUtilization", "GpuUtilizationSampler", "NvmlLike"]

log = structlog.get_logger("tokenmill.metrics")


class UtilizationRates(Protocol):
    gpu: int  # percent
    memory: int  # percent


class NvmlLike(Protocol):
    """The part of `pynvml` the sampler uses (a test passes a fake)."""

    @property
    def NVMLError(self) -> type[Exception]: ...  # what every call below may raise
    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> UtilizationRates: ...


@dataclass(frozen=True, slots=True)
class GpuUtilization:
    index: int  # NVML's device index
    gpu: float  # share of NVML's last sample period in which a kernel ran, 0-1
    memory_bandwidth: float  # share of that period in which device memory was read or written


class GpuUtilizationSampler:
    """`sample()` reads every GPU's utilisation now; NVML is loaded on the first call."""

    def __init__(self, nvml: NvmlLike | None = None) -> None:
        """`nvml`: the NVML bindings (default: `pynvml`, imported on first use)."""
        self._nvml = nvml
        self._state: Literal["new", "ready", "unavailable"] = "new"

    def sample(self) -> list[GpuUtilization]:
        nvml = self._started()
        if nvml is None:
            return []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError:
            return []
        samples = []
        for index in range(count):
            try:
                rates = nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(index))
            except nvml.NVMLError:
                continue  # e.g. a device fallen off the bus, or one that cannot tell
            samples.append(GpuUtilization(index, rates.gpu / 100, rates.memory / 100))
        return samples

    def _started(self) -> NvmlLike | None:
        if self._state == "new":
            self._state = "unavailable"  # unless nvmlInit succeeds: tried once, never again
            if self._nvml is None:
                try:
                    import pynvml  # here: a machine without NVIDIA's driver never needs it
                except ImportError as exc:
                    log.info("nvml_unavailable", error=str(exc))
                    return None
                self._nvml = pynvml
            try:
                self._nvml.nvmlInit()
            except self._nvml.NVMLError as exc:  # no driver: the usual case on a CPU machine
                log.info("nvml_unavailable", error=f"{type(exc).__name__}: {exc}")
                return None
            self._state = "ready"
        return self._nvml if self._state == "ready" else None
