"""GpuUtilizationSampler over a fake NVML: ratios, devices that fail, NVML that is not there."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest
from structlog.testing import capture_logs

from actors.telemetry.gpu_utilization import GpuUtilization, GpuUtilizationSampler


class FakeNvmlError(Exception):
    pass


@dataclass
class Rates:
    gpu: int
    memory: int


@dataclass
class FakeNvml:
    """Devices by index: their rates, or None for one whose every call fails."""

    devices: list[Rates | None]
    init_fails: bool = False
    calls: list[str] = field(default_factory=list)
    NVMLError = FakeNvmlError

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_fails:
            raise FakeNvmlError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("count")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Rates:
        assert isinstance(handle, int)
        rates = self.devices[handle]
        if rates is None:
            raise FakeNvmlError("GPU is lost")
        return rates


def test_percentages_become_ratios_per_device() -> None:
    nvml = FakeNvml([Rates(gpu=87, memory=40), Rates(gpu=0, memory=100)])
    sampler = GpuUtilizationSampler(nvml)
    assert sampler.sample() == [GpuUtilization(0, 0.87, 0.40), GpuUtilization(1, 0.0, 1.0)]
    nvml.devices[0] = Rates(gpu=12, memory=5)
    assert sampler.sample()[0] == GpuUtilization(0, 0.12, 0.05)
    assert nvml.calls.count("init") == 1


def test_a_device_whose_call_fails_is_left_out_and_the_others_report() -> None:
    sampler = GpuUtilizationSampler(FakeNvml([None, Rates(gpu=50, memory=25)]))
    assert sampler.sample() == [GpuUtilization(1, 0.5, 0.25)]


def test_a_failed_init_gives_nothing_is_logged_once_and_never_retried() -> None:
    nvml = FakeNvml([Rates(gpu=50, memory=25)], init_fails=True)
    sampler = GpuUtilizationSampler(nvml)
    with capture_logs() as logs:
        assert sampler.sample() == []
        assert sampler.sample() == []
    nvml.init_fails = False
    assert sampler.sample() == []
    assert nvml.calls == ["init"]
    assert [(log["event"], log["log_level"]) for log in logs] == [("nvml_unavailable", "info")]
    assert "Driver Not Loaded" in logs[0]["error"]


def test_without_pynvml_installed_there_is_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    sampler = GpuUtilizationSampler()
    with capture_logs() as logs:
        assert sampler.sample() == []
        assert sampler.sample() == []
    assert [log["event"] for log in logs] == ["nvml_unavailable"]


def test_with_the_real_pynvml_a_machine_without_a_driver_reports_nothing() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert GpuUtilizationSampler().sample() == []
    else:
        pynvml.nvmlShutdown()
        samples = GpuUtilizationSampler().sample()
        assert samples, "NVML answered but reported no GPU"
        assert all(0 <= s.gpu <= 1 and 0 <= s.memory_bandwidth <= 1 for s in samples)
