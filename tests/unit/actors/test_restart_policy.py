"""One-for-one restart policy: backoff doubles, a crash storm gives up, old crashes expire."""

from __future__ import annotations

import pytest

from actors.restart_policy import RestartPolicy


def test_backoff_doubles_up_to_a_cap_then_gives_up() -> None:
    policy = RestartPolicy(max_restarts=5, window_s=60, initial_backoff_s=0.1, max_backoff_s=1)
    delays = [policy.on_crash("gpu", now=float(t)) for t in range(6)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, None]


def test_children_are_counted_apart() -> None:
    policy = RestartPolicy(max_restarts=1)
    assert policy.on_crash("gpu", 0.0) == 0.1
    assert policy.on_crash("emitter", 0.0) == 0.1
    assert policy.on_crash("gpu", 1.0) is None
    assert (policy.recent("gpu"), policy.recent("emitter"), policy.total()) == (2, 1, 3)


def test_crashes_older_than_the_window_are_forgotten() -> None:
    policy = RestartPolicy(max_restarts=2, window_s=10)
    assert policy.on_crash("ingest", 0.0) == 0.1
    assert policy.on_crash("ingest", 5.0) == 0.2
    assert policy.on_crash("ingest", 10.5) == 0.2, "the crash at 0 s has left the window"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError):
        RestartPolicy(window_s=0)
