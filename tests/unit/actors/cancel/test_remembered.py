"""RecentCancels: ids remembered for a while, at most so many, the oldest forgotten first."""

from __future__ import annotations

import pytest

from actors.cancel.remembered import RecentCancels
from tests.unit.gpu.test_scheduler import FakeClock


def test_an_id_is_remembered_until_its_time_is_up() -> None:
    clock = FakeClock()
    recent = RecentCancels(capacity=8, ttl_s=10, clock=clock)
    recent.add("a")
    clock.now = 9.9
    assert "a" in recent and "b" not in recent
    clock.now = 10.0
    assert "a" not in recent and len(recent) == 0


def test_the_oldest_ids_go_first_when_full_and_a_repeat_counts_as_new() -> None:
    clock = FakeClock()
    recent = RecentCancels(capacity=2, ttl_s=100, clock=clock)
    recent.add("a")
    recent.add("b")
    recent.add("a")  # again: now the newest
    recent.add("c")
    assert "b" not in recent and "a" in recent and "c" in recent
    assert len(recent) == 2


@pytest.mark.parametrize("capacity, ttl", [(0, 1.0), (1, 0.0)])
def test_bounds_must_be_positive(capacity: int, ttl: float) -> None:
    with pytest.raises(ValueError):
        RecentCancels(capacity=capacity, ttl_s=ttl)
