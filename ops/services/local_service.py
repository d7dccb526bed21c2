"""The life a local service process shares (the Kafka broker, Jaeger): one per state dir,
recorded there, adopted when it already runs, stopped by whoever asks.

    .lock          held while starting or stopping, so two processes do not race
    <state file>   JSON: the running process's pid and ports (`broker.json`, `jaeger.json`)
    <log files>    what an error quotes the tail of when the service does not come up

A subclass adds its ports as fields and says what differs: how to launch (`_command`), what
ready means (`_ready`), how its process's command line shows (`_markers`), and its names.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ops.errors import OpsError
from ops.services.kafka_jars import file_lock
from ops.services.local_process import alive, runs_with, spawn_detached, terminate, wait_until


@dataclass(frozen=True)
class Recorded:
    """A state file read back: the process's pid and its ports, by field name."""

    pid: int
    ports: dict[str, int]


@dataclass
class LocalService(abc.ABC):
    """The service whose files live in `state_dir`; `pid` is its process once started or
    adopted. `start()` adopts one already running there (started by this process or another),
    and `stop()` stops whichever is recorded, so starting and stopping can be separate
    processes (`tokenmill up`, `tokenmill down`)."""

    state_dir: Path
    pid: int | None = field(default=None, init=False)

    _state_file: ClassVar[str]  # pid and ports of the running process
    _port_fields: ClassVar[tuple[str, ...]]  # recorded, and taken over on adoption, in this order
    _output_file: ClassVar[str]  # takes the process's stdout and stderr
    _log_files: ClassVar[tuple[str, ...]]  # whose tails an error quotes
    _log_lines: ClassVar[int]
    _title: ClassVar[str]  # the service as errors name it
    _start_error: ClassVar[type[OpsError]]

    def __post_init__(self) -> None:
        # Absolute: the process's command line names files in it, and `_running()` matches them.
        self.state_dir = self.state_dir.expanduser().resolve()

    def start(self, timeout: float) -> bool:
        """Launch the service, or adopt the running one, and wait until it is ready. True when
        this call launched it; a launch that does not become ready is killed again."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self._path(".lock")):
            running = self._running()
            if running is not None:
                self._adopt(running)
                self.wait_ready(timeout)
                return False
            self._launch()
            try:
                self.wait_ready(timeout)
            except self._start_error:
                self._kill(grace=5.0)
                raise
            return True

    def stop(self, grace: float) -> int | None:
        """Stop the recorded process: SIGTERM, SIGKILL after `grace` s. Its pid, or None."""
        if not self.state_dir.is_dir():
            return None
        with file_lock(self._path(".lock")):
            return self._kill(grace)

    def wait_ready(self, timeout: float) -> None:
        """Block until `_ready()` holds; `_start_error` if the process exits first or `timeout`
        s pass, with the tail of its logs."""
        failed = wait_until(self._ready, pid=self.pid, timeout=timeout)
        if failed == "exited":
            raise self._start_error(f"{self._title} (pid {self.pid}) exited; {self._log_tail()}")
        if failed == "timeout":
            raise self._start_error(
                f"{self._awaited()} did not answer within {timeout:.0f} s; " + self._log_tail()
            )

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """Prepare a launch (free ports chosen, config files written) and return its argv."""

    @abc.abstractmethod
    def _ready(self) -> bool:
        """Whether the launched or adopted process serves."""

    @abc.abstractmethod
    def _markers(self) -> tuple[str, ...]:
        """What the command line of this state dir's process holds (not a reused pid's)."""

    @abc.abstractmethod
    def _awaited(self) -> str:
        """What did not answer, as a timeout error names it."""

    def _adopt(self, running: Recorded) -> None:
        self.pid = running.pid
        for name, port in running.ports.items():
            setattr(self, name, port)

    def _launch(self) -> None:
        argv = self._command()
        self.pid = spawn_detached(argv, self._path(self._output_file))
        ports = {name: getattr(self, name) for name in self._port_fields}
        self._path(self._state_file).write_text(json.dumps({"pid": self.pid, **ports}) + "\n")

    def _running(self) -> Recorded | None:
        """The recorded process if it still runs; a stale record (dead or reused pid) is None."""
        try:
            fields = json.loads(self._path(self._state_file).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(fields, dict) or set(fields) != {"pid", *self._port_fields}:
            return None
        pid = fields.pop("pid")
        if not alive(pid) or not runs_with(pid, *self._markers()):
            return None
        return Recorded(pid, fields)

    def _kill(self, grace: float) -> int | None:
        running = self._running()
        self._path(self._state_file).unlink(missing_ok=True)
        self.pid = None
        if running is None:
            return None
        terminate(running.pid, grace)
        return running.pid

    def _path(self, name: str) -> Path:
        return self.state_dir / name

    def _log_tail(self) -> str:
        parts = []
        for name in self._log_files:
            path = self._path(name)
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-self._log_lines :]
                parts.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts) if parts else f"no log in {self.state_dir}"
