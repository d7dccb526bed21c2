"""Readiness: every condition it names must hold; each one alone makes the worker not ready."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from actors.health import Health


@dataclass
class Flags:
    joined: bool = True
    model_loaded: bool = True
    model_name: str = "m"
    listening: bool = True


def test_ready_when_every_condition_holds() -> None:
    flags = Flags()
    ready, details = Health(flags, flags, flags).readiness()
    assert ready
    assert details == {
        "consuming": True,
        "model_loaded": True,
        "model": "m",
        "draining": False,
        "children_down": [],
        "control": True,
    }


@pytest.mark.parametrize("flag", ["joined", "model_loaded", "listening"])
def test_not_ready_when_a_child_is_not(flag: str) -> None:
    flags = Flags(**{flag: False})  # type: ignore[arg-type]
    assert not Health(flags, flags, flags).readiness()[0]


def test_not_ready_while_draining_or_a_child_is_down() -> None:
    flags = Flags()
    health = Health(flags, flags, None)
    health.down.add("gpu")
    assert health.readiness() == (
        False,
        {
            "consuming": True,
            "model_loaded": True,
            "model": "m",
            "draining": False,
            "children_down": ["gpu"],
        },
    )
    health.down.clear()
    health.draining = True
    assert not health.readiness()[0]


@dataclass
class Watch:
    reachable: bool = True
    unreachable_since: str | None = None


def test_ready_says_the_broker_is_reachable() -> None:
    flags = Flags()
    ready, details = Health(flags, flags, flags, Watch()).readiness()
    assert ready and details["kafka"] == "reachable"


def test_not_ready_while_the_broker_is_unreachable_and_says_since_when() -> None:
    flags = Flags()  # joined: the consumer keeps its group while the broker is away
    watch = Watch(reachable=False, unreachable_since="2026-01-01T00:00:00Z")
    ready, details = Health(flags, flags, flags, watch).readiness()
    assert not ready
    assert details["kafka"] == "unreachable since 2026-01-01T00:00:00Z"
    assert details["consuming"] is True


def test_not_ready_before_the_broker_was_probed() -> None:
    flags = Flags()
    ready, details = Health(flags, flags, flags, Watch(reachable=False)).readiness()
    assert not ready and details["kafka"] == "not probed yet"


def test_live_until_the_engine_is_found_hung_then_not_with_the_reason() -> None:
    flags = Flags()
    health = Health(flags, flags, flags)
    assert health.liveness() == (True, {"status": "ok"})
    health.draining = True
    assert health.liveness()[0], "a drain is not a reason to be restarted"
    health.stalled = "engine step running for 31.0 s, over its bound of 30.0 s"
    assert health.liveness() == (
        False,
        {"status": "stalled", "reason": "engine step running for 31.0 s, over its bound of 30.0 s"},
    )
