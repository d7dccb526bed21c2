"""Health: what the worker's readiness probe (`/healthz/ready`) answers.

Read from the children's own public flags (the ingest joined its group, a model is loaded,
the control lane listens) and the marks the supervisor keeps here (children down between a
crash and their restart, draining). Made before the supervisor and the HTTP server, which
both hold it: the server asks, the supervisor marks.
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


class Health:
    def __init__(self, ingest: _Joined, gpu: _Serving, control: _Listening | None) -> None:
        self._ingest, self._gpu, self._control = ingest, gpu, control
        self.draining = False
        self.down: set[str] = set()  # children between a crash and their restart

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready: consuming, a model loaded, not draining, every child up, control listening."""
        details: dict[str, object] = {
            "consuming": self._ingest.joined,
            "model_loaded": self._gpu.model_loaded,
            "model": self._gpu.model_name,
            "draining": self.draining,
            "children_down": sorted(self.down),
        }
        if self._control is not None:
            details["control"] = self._control.listening
        ready = (
            bool(details["consuming"])
            and bool(details["model_loaded"])
            and not self.draining
            and not self.down
            and details.get("control", True) is True
        )
        return ready, details
