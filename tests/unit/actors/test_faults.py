"""Test-only faults: parsed from `TOKENMILL_FAULTS` (a typo refused), a hung step that ends
only when a test releases it, a leak that grows with every step."""

from __future__ import annotations

import threading

import pytest

from actors.faults import ENV, Faults, InjectedFault


def test_faults_are_read_from_the_environment_and_typos_refused() -> None:
    faults = Faults.from_env({"TOKENMILL_FAULTS": "hang_step_after=3, leak_mb_per_step=20"})
    assert (faults.hang_step_after, faults.leak_mb_per_step) == (3, 20)
    assert Faults.from_env({"TOKENMILL_FAULTS": "hang_step"}).hang_step_after == 0
    assert Faults.from_env({}) == Faults()
    with pytest.raises(ValueError, match="unknown fault 'hang_steps'"):
        Faults.from_env({"TOKENMILL_FAULTS": "hang_steps=1"})


class Waits(threading.Event):
    """An `unhang` that counts the waits on it and ends each at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return True


def test_a_step_hangs_from_the_one_asked_for_until_released() -> None:
    faults = Faults(hang_step_after=1)
    faults.unhang = waits = Waits()
    assert faults.stepping(lambda: "first", 0) == "first"
    assert waits.waits == 0, "the steps before it run"
    assert faults.stepping(lambda: "second", 1) == "second"
    assert faults.stepping(lambda: "third", 2) == "third"
    assert waits.waits == 2, "each step from the one asked for waits for the release"
    assert Faults().stepping(lambda: "x", 5) == "x" and Faults().unhang.is_set() is False


def test_a_leak_keeps_more_memory_after_every_step() -> None:
    faults = Faults(leak_mb_per_step=2)
    faults.after_gpu_step(1)
    faults.after_gpu_step(2)
    assert sum(map(len, faults._leaked)) == 4 << 20
    assert Faults().after_gpu_step(1) is None


def test_an_injected_crash_still_comes_after_its_steps() -> None:
    faults = Faults(gpu_crash_after_steps=2, leak_mb_per_step=1)
    faults.after_gpu_step(1)
    with pytest.raises(InjectedFault):
        faults.after_gpu_step(2)


def test_an_engine_error_on_a_request_for_its_first_attempts() -> None:
    faults = Faults.from_env({ENV: "engine_error_on=r-7,engine_error_attempts=1"})
    with pytest.raises(InjectedFault):
        faults.adding("r-7", 1)
    faults.adding("r-7", 2)  # its second attempt runs
    faults.adding("r-8", 1)
    every = Faults.from_env({ENV: "engine_error_on=r-7"})
    for attempt in (1, 2, 3):
        with pytest.raises(InjectedFault):
            every.adding("r-7", attempt)
