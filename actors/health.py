"""Health: what the worker's liveness (`/healthz`) and readiness (`/readyz`) probes answer.

Live unless the watchdog found the engine hung (`stalled`, the reason): the process then
leaves and exits, and an orchestrator that probes first restarts it all the same. Readiness is
read from the children's own public flags (the ingest joined its group, a model is loaded,
the control lane listens, the broker answers the `BrokerWatch`) and the marks the supervisor
keeps here (children down between a crash and their restart, draining). Made before the
supervisor and the HTTP server, which both hold it: the server asks, the supervisor marks.
"""

from __future__ import annotations

from typing import Protocol


class _Joined(Protocol):
    @property
    def joined(self) -> bool: ...


class _Serving(Protocol):
    @property
    def model_loaded(self) -> bool: ...

    @property
    def model_name(self) -> str: ...


class _Listening(Protocol):
    @property
    def listening(self) -> bool: ...


class _Reachable(Protocol):
    @property
    def reachable(self) -> bool: ...

    @property
    def unreachable_since(self) -> str | None: ...


class Health:
    def __init__(
        self,
        ingest: _Joined,
        gpu: _Serving,
        control: _Listening | None,
        kafka: _Reachable | None = None,
        *,
        cancel: _Listening | None = None,
    ) -> None:
        """`kafka`: the `BrokerWatch`; None leaves the broker out of readiness. `cancel`: the
        cancel topic's reader, if the worker has one."""
        self._ingest, self._gpu, self._control, self._kafka = ingest, gpu, control, kafka
        self._cancel = cancel
        self.draining = False
        self.down: set[str] = set()  # children between a crash and their restart
        self.stalled: str | None = None  # why the engine counts as hung (the watchdog's)

    def liveness(self) -> tuple[bool, dict[str, object]]:
        """Live: the engine is not hung. Not live: `{"status": "stalled", "reason": ...}`."""
        if self.stalled is not None:
            return False, {"status": "stalled", "reason": self.stalled}
        return True, {"status": "ok"}

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready: consuming, a model loaded, not draining, every child up, control and cancel
        listening, the broker reachable. `kafka` is "reachable", "unreachable since <ISO-8601
        UTC>", or "not probed yet" (not ready either)."""
        details: dict[str, object] = {
            "consuming": self._ingest.joined,
            "model_loaded": self._gpu.model_loaded,
            "model": self._gpu.model_name,
            "draining": self.draining,
            "children_down": sorted(self.down),
        }
        if self._control is not None:
            details["control"] = self._control.listening
        if self._cancel is not None:
            details["cancel"] = self._cancel.listening
        if self._kafka is not None:
            details["kafka"] = _kafka_reason(self._kafka)
        ready = (
            bool(details["consuming"])
            and bool(details["model_loaded"])
            and not self.draining
            and not self.down
            and details.get("control", True) is True
            and details.get("cancel", True) is True
            and details.get("kafka", "reachable") == "reachable"
        )
        return ready, details


def _kafka_reason(kafka: _Reachable) -> str:
    if kafka.reachable:
        return "reachable"
    since = kafka.unreachable_since
    return f"unreachable since {since}" if since is not None else "not probed yet"
