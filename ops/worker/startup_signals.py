"""SIGTERM or SIGINT while a worker starts: exit 0 with one log line, not a death by signal.

A worker takes a while to start: its imports, the broker preflight, loading the model (3-4 s
in all for SmolLM2 on a quiet 2-core machine, far longer on a busy one or for a larger
model). Until its event loop serves, Python's default handlers would end it with exit 143
(SIGTERM: killed, nothing logged) or a KeyboardInterrupt traceback (SIGINT), and an
orchestrator that stops a worker still starting would count a failure. So `tokenmill`'s entry
point (ops/cli.py `main`) installs the handler before it imports the command, and the command
takes that one over; run any other way (a test's `CliRunner`), the command installs its own.
This module imports nothing slow, so that it can come first.

    signals = StartupSignals().install()       # first thing
    try:
        ... start up ...                         # a signal raises StartupInterrupted here
        asyncio.run(serve(service, signals))     # signals.hand_to(loop, service.drain) first
    except StartupInterrupted as stop:
        stopped_during_startup(stop)             # logs `worker_stopped_during_startup`, exit 0

Python runs the handler on the main thread, between bytecodes: while it runs the preflight's
event loop, as it returns from a long call into native code, and while it waits for the engine
thread to load the model (`result_of`: a wait that wakes every `WAKE_S`, since a signal the
kernel hands to another thread does not interrupt the main thread's wait). Only the first
signal raises; later ones are remembered and ignored.

Once the worker's event loop runs, `serve` hands both signals to the loop (`hand_to`:
`loop.add_signal_handler`), where they drain the worker as usual; a signal that reached the
handler but was swallowed on the way (an `except BaseException` in a library) drains it as soon
as it serves. When the worker has stopped serving, `after_serving` ignores both: what is left
(sending the last spans) is bounded, and the loop's closing would otherwise restore the defaults
that kill.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

if TYPE_CHECKING:  # importing this module must cost nothing: `tokenmill` imports it first
    import asyncio
    from concurrent.futures import Future
    from types import FrameType

# SIGINT first: once SIGTERM is caught (as /proc/PID/status shows), both are.
SIGNALS = (signal.SIGINT, signal.SIGTERM)
WAKE_S = 0.2  # how late, at worst, a signal caught by another thread stops a wait

T = TypeVar("T")


class StartupInterrupted(BaseException):
    """SIGTERM or SIGINT before the worker serves. A BaseException, as KeyboardInterrupt is,
    so that no `except Exception` on the way (the preflight calls any failure "broker away")
    takes it for a failure and carries on (one that lands in an asyncio callback is logged and
    swallowed there: `StartupSignals.stop_for` still counts the start-up's end a stop). Kept
    here, beside its only raiser and catcher, rather than in `ops/errors.py`, which holds the
    errors `ops/` reports."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(sig.name)
        self.signal = sig


class StartupSignals:
    """The start-up handler for SIGTERM and SIGINT, and the first signal it received."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.serving = False  # `hand_to` ran: the signals drain the worker from then on

    def install(self) -> StartupSignals:
        for sig in SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def hand_to(self, loop: asyncio.AbstractEventLoop, drain: Callable[[], None]) -> None:
        """From now on the signals drain the worker, in `loop`; drains at once when one came
        and was swallowed."""
        self.serving = True
        for sig in SIGNALS:
            loop.add_signal_handler(sig, drain)
        if self.received is not None:
            drain()

    def after_serving(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)

    def stop_for(self, error: BaseException) -> StartupInterrupted | None:
        """Whether start-up ending with `error` is a stop: the error is (or was raised from)
        the handler's `StartupInterrupted`, or a signal came before serving and the error
        followed it (the handler's raise swallowed on the way, e.g. logged by an asyncio
        callback, and the start-up failed after it). None: a failure of its own."""
        stop = self.interruption(error)
        if stop is None and self.received is not None and not self.serving:
            stop = StartupInterrupted(self.received)
        return stop

    @staticmethod
    def interruption(error: BaseException) -> StartupInterrupted | None:
        """The `StartupInterrupted` that `error` is or was raised from: Python wraps one raised
        inside some import machinery (a class body's `__set_name__`, say) in a RuntimeError."""
        seen: set[int] = set()
        cause: BaseException | None = error
        while cause is not None and id(cause) not in seen:
            if isinstance(cause, StartupInterrupted):
                return cause
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        return None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            raise StartupInterrupted(self.received)


def result_of(future: Future[T]) -> T:
    """`future.result()` (the engine thread's build), waking every `WAKE_S` so that the main
    thread runs a pending handler even when another thread took the signal."""
    while True:
        try:
            return future.result(timeout=WAKE_S)
        except TimeoutError:
            continue


def startup_stop_line(sig: signal.Signals) -> str:
    """`worker_stopped_during_startup` as one JSON line, in the configured logger's shape
    (ops/worker/logging_setup.py), built from strings alone."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
    fields = {
        "signal": sig.name,
        "event": "worker_stopped_during_startup",
        "logger": "tokenmill.worker",
        "level": "info",
        "timestamp": stamp,
    }
    return "{" + ", ".join(f'"{key}": "{value}"' for key, value in fields.items()) + "}\n"


def stopped_during_startup(stop: StartupInterrupted) -> NoReturn:
    """Log the stop and exit 0 at once. `os._exit`: the engine thread may be in the middle of
    loading the model, and a normal exit would wait for it (the interpreter joins that thread);
    nothing else is held yet that an exit must release (no consumer has joined its group, no
    offset is owed), and the log is flushed first."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a second signal cannot cut the line short
    structlog = sys.modules.get("structlog")
    is_configured = getattr(structlog, "is_configured", None)
    if structlog is not None and is_configured is not None and is_configured():
        import logging

        structlog.get_logger("tokenmill.worker").info(
            "worker_stopped_during_startup", signal=stop.signal.name
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
    else:
        # Stopped before the command configured its logging, maybe in the middle of an import:
        # a module half imported (asyncio, say) would break any import that needs it, so the
        # line is written as the configured logger writes it, with nothing imported.
        sys.stderr.write(startup_stop_line(stop.signal))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
