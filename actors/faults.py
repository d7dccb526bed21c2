"""Test-only fault injection, off unless a test sets `TOKENMILL_FAULTS`.

Supervision is only trustworthy if a crash can be caused on purpose. A test starts a worker
with, for example, `TOKENMILL_FAULTS=gpu_crash_after_steps=20` and the GPU actor raises
`InjectedFault` after its 20th step (once; `gpu_crashes=2` for more), outside the engine's
own error handling, exactly as an unexpected bug would; `die_on_request=ID` ends the process
at once when it admits request ID (a crash no handler sees). Nothing here runs in production
unless that variable is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "TOKENMILL_FAULTS"


class InjectedFault(RuntimeError):
    """Raised by a fault a test asked for."""


@dataclass
class Faults:
    gpu_crash_after_steps: int | None = None
    gpu_crashes: int = 1  # how many times to crash (each after that many more steps)
    die_on_request: str | None = None  # the process exits at once (70) when it admits this id

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Faults:
        """Parse `key=value,key=value`; unknown keys are refused so a typo is not silent."""
        spec = (environ if environ is not None else dict(os.environ)).get(ENV, "").strip()
        faults = cls()
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, value = part.partition("=")
            if key == "die_on_request":
                faults.die_on_request = value
                continue
            if key not in ("gpu_crash_after_steps", "gpu_crashes"):
                raise ValueError(f"{ENV}: unknown fault {key!r}")
            setattr(faults, key, int(value))
        return faults

    def on_admit(self, request_id: str) -> None:
        """A process death with this request in flight, as a crash in native code would be."""
        if self.die_on_request is not None and request_id == self.die_on_request:
            os._exit(70)

    def after_gpu_step(self, steps: int) -> None:
        n = self.gpu_crash_after_steps
        if n is not None and self.gpu_crashes > 0 and steps >= n:
            self.gpu_crashes -= 1
            self.gpu_crash_after_steps = steps + n
            raise InjectedFault(f"injected GPU actor crash after step {steps}")
