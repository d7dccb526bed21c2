"""Supervisor: runs the worker's actors in one `TaskGroup`, restarts what crashes, drains.

    control ──VerifiedCommand──► supervisor ──SwapOrder──► gpu
    every child ◄── started, watched, restarted (one-for-one, backoff) ── supervisor

A child whose `run()` raises is restarted after a backoff (see `RestartPolicy`); before the
GPU actor runs again it gives back what its engines held (`GpuActor.recover`), so every
request still gets exactly one result. More crashes than the policy allows, or an HTTP port
that cannot be bound, make the worker drain and exit non-zero (`exit_code`).

`drain()` (SIGTERM/SIGINT, a `Drain` command, the memory guard): stop fetching, let in-flight
work finish within `shutdown_timeout_s`, fail what is left with `shutting_down`, commit, close.
`engine_stalled()` (the watchdog): not live; leave without waiting for the hung engine (what
it held stays uncommitted, for the partitions' next owners); exit non-zero.
Mailbox: `VerifiedCommand`s from the control actor.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import structlog

from actors.cancel.actor import CancelActor
from actors.config import WorkerConfig
from actors.control import ControlActor
from actors.emitter import EmitterActor
from actors.gpu_actor import GpuActor
from actors.health import Health
from actors.http_server import HttpServer
from actors.ingest.actor import IngestActor
from actors.kafka.broker_watch import BrokerWatch
from actors.kafka.errors import KafkaUnusable
from actors.mail import SwapOrder, VerifiedCommand
from actors.restart_policy import RestartPolicy
from actors.runtime import Actor, Mailbox
from actors.swap.model_paths import AliasResolver, ModelPathRefused, resolve_in_models_dir
from actors.task_stacks import task_stacks, thread_stacks
from actors.telemetry.lifecycle_spans import publish_event
from messages.control import Drain, Rollback, Status, SwapModel
from messages.events import (
    ChildRestarted,
    Event,
    ModelSwapFailed,
    StatusReply,
    WorkerDraining,
    WorkerStarted,
    WorkerStopped,
)

log = structlog.get_logger("tokenmill.supervisor")


class Child(Protocol):
    """What the supervisor runs: an actor, or the HTTP server."""

    name: str

    async def run(self) -> None: ...

    def stop(self) -> None: ...


_GRACE_S = 30.0  # beyond shutdown_timeout_s, before a stuck drain is cut short


class Supervisor(Actor[VerifiedCommand]):
    MAILBOX_SIZE = 64

    def __init__(
        self,
        config: WorkerConfig,
        ingest: IngestActor,
        gpu: GpuActor,
        emitter: EmitterActor,
        mailbox: Mailbox[VerifiedCommand] | None = None,
        *,
        control: ControlActor | None = None,
        cancel: CancelActor | None = None,
        http: HttpServer | None = None,
        broker_watch: BrokerWatch | None = None,
        health: Health | None = None,
        models_dir: Path | None = None,
        aliases: AliasResolver | None = None,
        on_restart: Callable[[str], None] | None = None,
        guards: Sequence[Child] = (),
    ) -> None:
        """`mailbox`: where the control actor sends verified commands. `control`: the
        `ControlActor` (commands in, events out), `cancel`: the cancel topic's reader, `http`:
        the health and metrics server, `broker_watch`: whether the cluster answers; all
        optional. `health`: what the readiness probe reads (the supervisor marks it).
        `models_dir`/`aliases`: where swaps may load from. `guards`: the watchdog and the
        memory guard (`actors.guards`), run beside the actors until the end."""
        super().__init__("supervisor", mailbox or Mailbox(self.MAILBOX_SIZE))
        self.config = config
        self.ingest, self.gpu, self.emitter = ingest, gpu, emitter
        self.control, self.http, self.broker_watch = control, http, broker_watch
        self.cancel = cancel
        self.health = health or Health(ingest, gpu, control, broker_watch, cancel=cancel)
        self.models_dir = models_dir
        self.aliases = aliases
        self.on_restart = on_restart
        self.guards = tuple(guards)
        self.policy = RestartPolicy(config.max_restarts, config.restart_window_s)
        self.exit_code = 0
        self.given_up: set[str] = set()  # children that crashed too often to restart
        self.started_at = time.monotonic()
        self.started = asyncio.Event()
        self._drain = asyncio.Event()
        self._drain_reason = "signal"
        self._drain_command: str | None = None
        self._swaps: asyncio.Queue[tuple[str | None, str]] = asyncio.Queue()  # (model, nonce)

    @property
    def down(self) -> set[str]:
        """Children between a crash and their restart."""
        return self.health.down

    # -- what others may call ------------------------------------------------------------

    def drain(self, reason: str = "signal", command: str | None = None) -> None:
        """Begin a graceful shutdown. Safe to call more than once, from a signal handler too.
        `command`: the nonce of the `Drain` command that asked for it, for its events."""
        if not self._drain.is_set():
            self._drain_reason, self._drain_command = reason, command
            log.info("worker_draining", reason=reason, timeout_s=self.config.shutdown_timeout_s)
        self._drain.set()

    def engine_stalled(self, reason: str) -> None:
        """The engine is hung (the watchdog's `reason`): `/healthz` answers 503; the worker
        stops fetching and leaves its group without waiting for the engine (the GPU actor is
        given up, so nothing it held is committed: its records go to the partitions' next
        owners), then exits 1."""
        self.health.stalled = reason
        self.given_up.add("gpu")
        self._give_up(f"engine hung: {reason}")

    # -- the worker's life ---------------------------------------------------------------

    async def run(self) -> None:
        children: list[Child] = [self.emitter, self.gpu, self.ingest]
        if self.control is not None:
            children.append(self.control)
        if self.cancel is not None:
            children.append(self.cancel)
        if self.http is not None:
            children.append(self.http)
        if self.broker_watch is not None:
            children.append(self.broker_watch)
        children += self.guards
        async with asyncio.TaskGroup() as tg:
            tasks = {c.name: tg.create_task(self._supervise(c), name=c.name) for c in children}
            commands = tg.create_task(self._commands(), name="commands")
            swaps = tg.create_task(self._swap_orders(), name="swap-orders")
            self.started.set()
            self._publish(
                WorkerStarted(
                    worker=self.config.worker_id,
                    at=time.time(),
                    model=self.gpu.front.ref,
                    group=self.config.group,
                    requests_topic=self.config.requests_topic,
                    max_model_len=self.gpu.front.max_model_len,
                )
            )
            await self._drain.wait()
            self.health.draining = True
            self._publish(
                WorkerDraining(
                    worker=self.config.worker_id,
                    at=time.time(),
                    command=self._drain_command,
                    reason=self._drain_reason,
                    in_flight=self.gpu.running,
                )
            )
            try:
                async with asyncio.timeout(self.config.shutdown_timeout_s + _GRACE_S):
                    await self._stop_children(tasks)
            except TimeoutError:
                log.error("drain_stuck", children=[n for n, t in tasks.items() if not t.done()],
                          tasks=task_stacks(), threads=thread_stacks())  # fmt: skip
                self.exit_code = self.exit_code or 1
                for task in tasks.values():
                    task.cancel()
            commands.cancel()
            swaps.cancel()
        log.info(
            "worker_stopped",
            records=self.ingest.records_read,
            results=self.emitter.results_sent,
            dlq=self.emitter.dead_letters_sent,
            exit_code=self.exit_code,
        )

    async def _stop_children(self, tasks: dict[str, asyncio.Task[None]]) -> None:
        """Ingest first (stop fetching, wait for outcomes), then GPU, emitter, control, cancel,
        HTTP, broker watch, guards."""
        ingesting, stepping, emitting = tasks["ingest"], tasks["gpu"], tasks["emitter"]
        self.ingest.stop()
        if self.given_up & {"ingest", "gpu", "emitter"}:
            await self._abandon(tasks)
        else:
            try:
                await asyncio.wait_for(asyncio.shield(ingesting), self.config.shutdown_timeout_s)
            except TimeoutError:
                log.warning("drain_timeout", running=self.gpu.running)
            self.gpu.stop()  # fails whatever is left; the ingest then sees every outcome
            await stepping
            while not ingesting.done():  # a batch the ingest was still handing over
                await self.gpu.fail_queued()
                await asyncio.wait({ingesting}, timeout=0.1)
            self.emitter.stop()
            await emitting
        self._publish(
            WorkerStopped(
                worker=self.config.worker_id,
                at=time.time(),
                command=self._drain_command,
                answered=self.emitter.results_sent,
                failed_on_shutdown=self.gpu.failed_on_shutdown,
            )
        )
        for child in (self.control, self.cancel, self.http, self.broker_watch, *self.guards):
            if child is not None:
                child.stop()
                await tasks[child.name]

    async def _abandon(self, tasks: dict[str, asyncio.Task[None]]) -> None:
        """A core actor is gone for good: what is in flight cannot be answered here. Leave
        it uncommitted (another worker answers it) and answer nothing with `shutting_down`."""
        log.warning("abandoning_in_flight", lost=sorted(self.given_up))
        core = [tasks["ingest"], tasks["gpu"]]
        for task in core:
            task.cancel()
        await asyncio.wait(core)
        if "emitter" in self.given_up:
            return
        self.emitter.stop()  # what it holds was answered; let it reach the broker
        await tasks["emitter"]

    async def _supervise(self, child: Child) -> None:
        """Run `child` until it returns; restart it when it crashes, within the policy."""
        while True:
            try:
                await child.run()
                return
            except Exception as exc:
                if child is self.http and _cannot_bind(exc):
                    log.error("http_unavailable", port=self.config.http_port, error=repr(exc))
                    self._give_up(f"cannot serve HTTP on port {self.config.http_port}: {exc}")
                    return
                if isinstance(exc, KafkaUnusable):  # a setting to fix: restarting cannot help
                    log.error("kafka_unusable", child=child.name, reason=str(exc))
                    self.given_up.add(child.name)
                    self._give_up(f"kafka: {exc}")
                    return
                self.down.add(child.name)
                backoff = self.policy.on_crash(child.name, time.monotonic())
                restarts = self.policy.recent(child.name)
                log.exception(
                    "child_crashed", child=child.name, restarts=restarts, backoff_s=backoff
                )
                if backoff is None:
                    self.given_up.add(child.name)
                    window = self.config.restart_window_s
                    self._give_up(f"{child.name} crashed {restarts} times within {window:.0f} s")
                    return
                if self.on_restart is not None:
                    self.on_restart(child.name)
                self._publish(
                    ChildRestarted(
                        worker=self.config.worker_id,
                        at=time.time(),
                        child=child.name,
                        error=repr(exc)[:500],
                        restarts=restarts,
                        backoff_ms=backoff * 1e3,
                    )
                )
                await asyncio.sleep(backoff)
                if child is self.gpu:
                    for outcome in self.gpu.recover():
                        await self.emitter.send(outcome)
                self.down.discard(child.name)
                log.info("child_restarted", child=child.name)

    def _give_up(self, why: str) -> None:
        log.error("worker_giving_up", reason=why)
        self.exit_code = 1
        self.drain(why)

    # -- commands ------------------------------------------------------------------------

    async def _commands(self) -> None:
        while (verified := await self.receive()) is not None:
            command, nonce = verified.command, verified.nonce
            log.info("command_received", command=type(command).__name__, nonce=nonce)
            if isinstance(command, SwapModel):
                self._swaps.put_nowait((command.model, nonce))
            elif isinstance(command, Rollback):
                self._swaps.put_nowait((None, nonce))
            elif isinstance(command, Drain):
                self.drain("drain command", nonce)
            elif isinstance(command, Status):
                self._publish(self.status(nonce))

    async def _swap_orders(self) -> None:
        """Swap and rollback commands, in order; resolving a name may fetch a model, so this
        runs apart from the command loop (a Status or Drain never waits behind a download)."""
        while True:
            name, nonce = await self._swaps.get()
            if name is None:
                await self.gpu.send(SwapOrder(target=None, requested="rollback", command=nonce))
            else:
                await self._swap(name, nonce)

    async def _swap(self, name: str, nonce: str) -> None:
        models_dir = self.models_dir
        try:
            if models_dir is None:
                raise ModelPathRefused("this worker has no models directory configured")
            path = await asyncio.to_thread(resolve_in_models_dir, name, models_dir, self.aliases)
        except Exception as exc:  # a refused path or an alias that cannot be fetched
            log.warning("swap_refused", model=name, reason=str(exc))
            self._publish(
                ModelSwapFailed(
                    worker=self.config.worker_id,
                    at=time.time(),
                    command=nonce,
                    to_model=name,
                    reason=str(exc),
                )
            )
            return
        await self.gpu.send(SwapOrder(target=path, requested=name, command=nonce))

    def status(self, nonce: str | None = None) -> StatusReply:
        gpu = self.gpu
        running = gpu.running
        blocks_used, blocks_total = gpu.kv_blocks
        return StatusReply(
            worker=self.config.worker_id,
            at=time.time(),
            command=nonce,
            model=gpu.front.ref,
            uptime_s=time.monotonic() - self.started_at,
            queued=max(self.ingest.outstanding - running, 0),
            running=running,
            kv_blocks_used=blocks_used,
            kv_blocks_total=blocks_total,
            standby=gpu.standby,
            draining=self.health.draining,
            restarts=self.policy.total(),
            max_model_len=gpu.front.max_model_len,
        )

    def _publish(self, event: Event) -> None:
        publish_event(self.control, event)


def _cannot_bind(exc: Exception) -> bool:
    """The HTTP port is taken or not ours: a configuration error, not worth restarting for."""
    return isinstance(exc, OSError) and exc.errno in (
        errno.EADDRINUSE,
        errno.EACCES,
        errno.EADDRNOTAVAIL,
    )
