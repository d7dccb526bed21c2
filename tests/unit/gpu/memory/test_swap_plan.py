"""Flip when both models fit, drain when they do not: by budget, or by free memory."""

from __future__ import annotations

from gpu.memory.swap_plan import SAFETY_MARGIN, plan_swap

GIB = 1 << 30


def test_a_budget_counts_the_active_model_and_the_new_one() -> None:
    fits = plan_swap(
        active_bytes=3 * GIB, standby_bytes=0, new_bytes=4 * GIB, free_bytes=0, budget_bytes=8 * GIB
    )
    assert fits.both_fit and fits.mode == "flip"
    tight = plan_swap(
        active_bytes=5 * GIB, standby_bytes=0, new_bytes=4 * GIB, free_bytes=0, budget_bytes=8 * GIB
    )
    assert not tight.both_fit and tight.mode == "drain"
    assert "drain mode" in tight.describe()


def test_without_a_budget_free_memory_and_the_standby_decide() -> None:
    new = 4 * GIB
    just = int(new / SAFETY_MARGIN) + 1
    assert plan_swap(
        active_bytes=9 * GIB, standby_bytes=0, new_bytes=new, free_bytes=just, budget_bytes=None
    ).both_fit
    assert not plan_swap(
        active_bytes=0, standby_bytes=0, new_bytes=new, free_bytes=new, budget_bytes=None
    ).both_fit, "a safety margin is kept"
    assert plan_swap(
        active_bytes=0, standby_bytes=2 * GIB, new_bytes=new, free_bytes=3 * GIB, budget_bytes=None
    ).both_fit, "releasing the standby first makes room"
