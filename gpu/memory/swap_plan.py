"""Whether a swap can load the new model beside the one serving, or must drain first.

Pure arithmetic over byte counts (no torch), so every branch is unit-tested:

- with a budget (bytes for every loaded model and its KV pool): both fit when the active
  engine plus the new one stay within it;
- without one, the device decides: the new engine must fit in what is free now plus what
  releasing the standby engine gives back, keeping a safety margin.

When both fit, a swap loads in the background and flips (no pause). When they do not, it
drains: stop admitting, finish in-flight work, unload, load, resume. Never an OOM.
"""

from __future__ import annotations

from dataclasses import dataclass

SAFETY_MARGIN = 0.9  # of free device memory a new model may plan to take


@dataclass(frozen=True)
class SwapPlan:
    both_fit: bool
    active_bytes: int
    new_bytes: int
    room_bytes: int  # what the new model may take while the active one stays loaded
    budget_bytes: int | None

    @property
    def mode(self) -> str:
        return "flip" if self.both_fit else "drain"

    def describe(self) -> str:
        mib = 1 << 20
        verdict = "both fit" if self.both_fit else "both do not fit: drain mode"
        return (
            f"{verdict} (active {self.active_bytes / mib:.0f} MiB, new "
            f"{self.new_bytes / mib:.0f} MiB, room {self.room_bytes / mib:.0f} MiB)"
        )


def plan_swap(
    *,
    active_bytes: int,
    standby_bytes: int,
    new_bytes: int,
    free_bytes: int,
    budget_bytes: int | None,
) -> SwapPlan:
    """`standby_bytes`: what the standby slot holds now (released before the load)."""
    if budget_bytes is not None:
        room = budget_bytes - active_bytes
    else:
        room = int((free_bytes + standby_bytes) * SAFETY_MARGIN)
    return SwapPlan(
        both_fit=new_bytes <= room,
        active_bytes=active_bytes,
        new_bytes=new_bytes,
        room_bytes=max(room, 0),
        budget_bytes=budget_bytes,
    )
