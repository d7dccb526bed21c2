"""Test-only fault injection, off unless a test sets `TOKENMILL_FAULTS`.

Supervision is only trustworthy if a crash can be caused on purpose. A test starts a worker
with, for example, `TOKENMILL_FAULTS=gpu_crash_after_steps=20` and the GPU actor raises
`InjectedFault` after its 20th step (once; `gpu_crashes=2` for more), outside the engine's
own error handling, exactly as an unexpected bug would; `die_on_request=ID` ends the process
at once when it admits request ID (a crash no handler sees); `hang_step_after=N` (or bare
`hang_step`: N=0) makes the engine thread's step after the Nth never return, as a hung kernel
would (the watchdog's case), and `stall_linger_s=N` has the worker answer `/healthz` 503 for N
seconds before it leaves (so a test's probe sees it: leaving takes milliseconds);
`leak_mb_per_step=N` keeps N MiB more resident after every step
(the memory guard's case); `engine_error_on=ID` fails request ID's addition to the engine
(answered `engine_error`, a transient failure) on its first `engine_error_attempts=K`
attempts (default: every attempt: the retries' case). Nothing here runs in production unless
that variable is set.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

ENV = "TOKENMILL_FAULTS"


class InjectedFault(RuntimeError):
    """Raised by a fault a test asked for."""


@dataclass
class Faults:
    gpu_crash_after_steps: int | None = None
    gpu_crashes: int = 1  # how many times to crash (each after that many more steps)
    die_on_request: str | None = None  # the process exits at once (70) when it admits this id
    hang_step_after: int | None = None  # the step after this many never returns
    stall_linger_s: int = 0  # seconds not live before a hung worker leaves
    leak_mb_per_step: int = 0  # MiB kept resident after every step
    engine_error_on: str | None = None  # this request id fails in the engine...
    engine_error_attempts: int | None = None  # ...on its first this many attempts (None: all)
    # What a hung step waits for: nothing sets it in a worker; a test may, to end the hang.
    unhang: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _leaked: list[bytes] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Faults:
        """Parse `key=value,key=value`; unknown keys are refused so a typo is not silent."""
        spec = (environ if environ is not None else dict(os.environ)).get(ENV, "").strip()
        faults = cls()
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, value = part.partition("=")
            if key in ("die_on_request", "engine_error_on"):
                setattr(faults, key, value)
                continue
            if key == "hang_step" and not value:
                faults.hang_step_after = 0
                continue
            if key not in ("gpu_crash_after_steps", "gpu_crashes", "hang_step_after",
                           "stall_linger_s", "leak_mb_per_step",
                           "engine_error_attempts"):  # fmt: skip
                raise ValueError(f"{ENV}: unknown fault {key!r}")
            setattr(faults, key, int(value))
        return faults

    def on_admit(self, request_id: str) -> None:
        """A process death with this request in flight, as a crash in native code would be."""
        if self.die_on_request is not None and request_id == self.die_on_request:
            os._exit(70)

    def adding(self, request_id: str, attempt: int) -> None:
        """Before request `request_id`'s `attempt` is added to the engine: an engine error,
        when a test asked for one."""
        if self.engine_error_on is None or request_id != self.engine_error_on:
            return
        if self.engine_error_attempts is None or attempt <= self.engine_error_attempts:
            raise InjectedFault(f"injected engine error on attempt {attempt}")

    def stepping(self, step: Callable[[], T], steps: int) -> T:
        """Run one engine step on the engine thread, `steps` having run before it; it hangs
        first (until `unhang`, which no worker sets) when a test asked for that."""
        if self.hang_step_after is not None and steps >= self.hang_step_after:
            self.unhang.wait()
        return step()

    def after_gpu_step(self, steps: int) -> None:
        if self.leak_mb_per_step > 0:  # written, so every page is resident
            self._leaked.append(b"\x01" * (self.leak_mb_per_step << 20))
        n = self.gpu_crash_after_steps
        if n is not None and self.gpu_crashes > 0 and steps >= n:
            self.gpu_crashes -= 1
            self.gpu_crash_after_steps = steps + n
            raise InjectedFault(f"injected GPU actor crash after step {steps}")
