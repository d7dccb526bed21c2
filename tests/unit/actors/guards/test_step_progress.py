"""The stall bound follows the model's measured steps, never under the floor; a step counts as
hung only while it runs past that bound. A fake clock: no step takes real time."""

from __future__ import annotations

import pytest

from actors.guards.step_progress import StepProgress, stall_bound


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bound_is_a_multiple_of_the_slowest_recent_step_never_under_the_floor() -> None:
    assert stall_bound([], floor_s=30.0, multiple=10.0) == 30.0, "no history: the floor"
    assert stall_bound([0.02, 0.5, 0.1], floor_s=30.0, multiple=10.0) == 30.0
    assert stall_bound([0.02, 5.0, 0.1], floor_s=30.0, multiple=10.0) == 50.0
    assert stall_bound([2.0], floor_s=1.0, multiple=3.0) == 6.0


def step_taking(clock: Clock, seconds: float) -> object:
    def step() -> str:
        clock.now += seconds
        return "out"

    return step


def test_timed_reports_the_step_and_learns_the_bound_from_it() -> None:
    clock = Clock()
    progress = StepProgress(floor_s=1.0, multiple=4.0, clock=clock)
    assert progress.bound_s == 1.0 and progress.running_since is None
    assert progress.timed(step_taking(clock, 0.5)) == "out"  # type: ignore[arg-type]
    assert progress.steps == 1 and progress.bound_s == 2.0
    progress.timed(step_taking(clock, 0.1))  # type: ignore[arg-type]
    assert progress.bound_s == 2.0, "the slowest of the recent steps, not the last"
    assert progress.running_for(clock.now) == 0.0 and progress.stalled(clock.now) is None


def test_the_bound_forgets_steps_older_than_the_window() -> None:
    clock = Clock()
    progress = StepProgress(floor_s=1.0, multiple=4.0, window=2, clock=clock)
    for seconds in (3.0, 0.1, 0.1):
        progress.timed(step_taking(clock, seconds))  # type: ignore[arg-type]
    assert progress.bound_s == 1.0, "the slow first step left the window: the floor again"


def test_a_step_running_past_the_bound_is_hung_and_one_that_ends_is_not() -> None:
    clock = Clock()
    progress = StepProgress(floor_s=2.0, multiple=10.0, clock=clock)
    seen: list[str | None] = []

    def hanging() -> None:
        clock.now += 2.0
        seen.append(progress.stalled(clock.now))  # exactly at the bound: not yet
        assert progress.running_for(clock.now) == 2.0
        clock.now += 0.5
        seen.append(progress.stalled(clock.now))

    progress.timed(hanging)
    assert seen[0] is None
    assert seen[1] == "engine step running for 2.5 s, over its bound of 2.0 s"
    assert progress.stalled(clock.now) is None, "it came back: no longer hung"


def test_a_step_that_raises_has_ended_too() -> None:
    clock = Clock()
    progress = StepProgress(floor_s=1.0, multiple=2.0, clock=clock)

    def broken() -> None:
        clock.now += 0.25
        raise RuntimeError("engine error")

    with pytest.raises(RuntimeError):
        progress.timed(broken)
    assert progress.running_since is None and progress.steps == 1


@pytest.mark.parametrize(("floor_s", "multiple"), [(0.0, 10.0), (30.0, 0.0), (-1.0, 1.0)])
def test_a_bound_that_could_never_be_met_is_refused(floor_s: float, multiple: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        StepProgress(floor_s, multiple)
