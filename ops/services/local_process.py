"""Local service processes (the Kafka broker, Jaeger): start detached, probe, wait, stop.

Used by `ops/services/local_service.py` (the life every such service shares) and the services
themselves. Plain functions over pids and ports.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spawn_detached(argv: list[str], output: Path) -> int:
    """Start `argv` in a session of its own, stdout and stderr appended to `output`.

    `os.posix_spawn`, not `subprocess.Popen`: the broker outlives any Popen object (and often
    this process), and a Popen collected while its child runs emits a ResourceWarning.
    """
    return os.posix_spawn(
        argv[0],
        argv,
        os.environ,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(output), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # Python ignores these; Popen resets them too
    )


def alive(pid: int) -> bool:
    """Whether `pid` runs; reaps it first if it is our exited child (else it stays a zombie)."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped == 0
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        pass
    return True


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM does
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def terminate(pid: int, grace: float) -> None:
    """SIGTERM `pid`, then SIGKILL if it still runs after `grace` seconds; gone is fine."""
    try:
        os.kill(pid, signal.SIGTERM)
        if not wait_exit(pid, grace):
            os.kill(pid, signal.SIGKILL)
            wait_exit(pid, 10.0)
    except ProcessLookupError:
        pass


def wait_until(ready: Callable[[], bool], *, pid: int | None, timeout: float) -> str | None:
    """Poll `ready` until it holds (None), `pid` exits ("exited") or `timeout` s pass
    ("timeout"); the caller turns a failure into its own error, with its log."""
    deadline = time.monotonic() + timeout
    while True:
        if pid is not None and not alive(pid):
            return "exited"
        if ready():
            return None
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.2)


def runs_with(pid: int, *arguments: str) -> bool:
    """Whether `pid`'s command line holds every one of `arguments` (guards against pid reuse
    when adopting a recorded process)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: trust the record
    except OSError:
        return False
    return all(argument.encode() in argv for argument in arguments)
