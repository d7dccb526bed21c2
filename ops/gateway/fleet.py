"""What the fleet serves, for `GET /v1/models`: read from the workers' events topic, checked
against the requests' consumer group.

Each worker announces its model when it starts (`worker_started`) and when it swaps
(`model_swapped`), and answers status requests with it (`status_reply`); `worker_stopped`
takes it off. The gateway reads the events topic from its beginning (it is small: one record
per such event) and keeps each worker's current model; the models listed are those at least
one listed worker serves.

A worker killed without a `worker_stopped` (SIGKILL, out of memory, its machine lost) says
nothing more, but its ingest consumer leaves the requests' consumer group once the worker's
session timeout passes (`--session-timeout-ms`, 10 s by default). So every `--models-refresh`
seconds the gateway describes that group (`--group`) and lists only:

    the workers whose ingest consumer is a member (client id `tokenmill-<worker id>`),
    and those whose last event is at most one refresh interval old

(a worker just started may not have joined the group yet). The others are hidden, not
forgotten: each check decides afresh, and any event unhides, so a worker cut off from the
broker for a while is listed again once it is back. Describing a group is a read (the
group's Describe ACL): the gateway holds no control secret and sends no command. A check that
fails (no such ACL, the broker away) changes nothing: what was listed stays listed, and the
failure is logged at warning once, until a check works again.

The same list decides whether a request can be sent at all (`FleetWatch.refuses`): once the
topic has been read to where it ended when the gateway started, a request for a model no
listed worker serves (or any request, none listed) is answered 503 `no_worker` at once
instead of waiting for a result that no worker will produce. Each worker also announces its
model's `max_model_len` (the model cards' field) and its task (`ModelRef.task`: "embed" for
an embedding model), which the model cards show and the doors check (`tasks`): a generation
request for a model that only embeds, or the other way round, is refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code

from actors.kafka import record_reader
from actors.kafka.connection import KafkaConnection
from messages import headers as h
from messages.codec import Codec, normalize_content_type
from messages.errors import MessageError
from messages.events import Event, ModelSwapped, StatusReply, WorkerStarted, WorkerStopped
from messages.result import ModelRef

log = structlog.get_logger("tokenmill.gateway")
_event_codec: Codec[Event] = Codec(Event)  # type: ignore[arg-type]  # a union, not a class
CLIENT_PREFIX = "tokenmill-"  # + worker id: the ingest consumer's client_id (actors/kafka)
_DESCRIBE_TIMEOUT_S = 10.0


EMBED = "embed"  # `ModelRef.task` of an embedding model
GENERATE = "generate"  # how a card names the task of a generative one (`ModelRef.task` "")


@dataclass(frozen=True)
class ServedModel:
    name: str
    since: int  # unix seconds: when a worker first announced it (OpenAI's `created`)
    max_model_len: int | None = None  # the least its listed workers announce (None: unsaid)
    task: str = GENERATE  # EMBED or GENERATE, as its listed workers announce it


class Fleet:
    """Each worker's current model, from the events it publishes (`apply`), less the workers
    a check of the consumer group hides (`list_only`)."""

    def __init__(self) -> None:
        self._by_worker: dict[str, ModelRef] = {}
        self._max_len: dict[str, int] = {}  # worker: its model's max_model_len, when said
        self._since: dict[str, int] = {}
        self._heard: dict[str, float] = {}  # worker: `at` of its latest event
        self._hidden: set[str] = set()

    def apply(self, event: Event) -> None:
        match event:
            case WorkerStarted(model=model) | StatusReply(model=model):
                self._serve(event.worker, model, event.max_model_len, event.at)
            case ModelSwapped(to_model=model):
                self._serve(event.worker, model, event.max_model_len, event.at)
            case WorkerStopped():
                self._by_worker.pop(event.worker, None)
                self._max_len.pop(event.worker, None)
                self._heard.pop(event.worker, None)
                self._hidden.discard(event.worker)
                return
        if event.worker in self._by_worker:
            self._heard[event.worker] = max(event.at, self._heard.get(event.worker, event.at))
            self._hidden.discard(event.worker)

    def _serve(self, worker: str, model: ModelRef, max_model_len: int, at: float) -> None:
        self._by_worker[worker] = model
        if max_model_len > 0:
            self._max_len[worker] = max_model_len
        else:
            self._max_len.pop(worker, None)
        self._since.setdefault(model.name, int(at))

    def list_only(self, members: Set[str], now: float, grace_s: float) -> None:
        """Hide every worker that is not in `members` (the worker ids in the consumer group)
        and has published nothing for more than `grace_s` before `now` (unix seconds); list
        the others again."""
        self._hidden = {
            worker
            for worker in self._by_worker
            if worker not in members and now - self._heard[worker] > grace_s
        }

    @property
    def hidden(self) -> frozenset[str]:
        return frozenset(self._hidden)

    def models(self) -> list[ServedModel]:
        lengths: dict[str, list[int]] = {}
        tasks: dict[str, str] = {}
        for worker, model in self._listed():
            found = lengths.setdefault(model.name, [])
            if worker in self._max_len:
                found.append(self._max_len[worker])
            tasks.setdefault(model.name, task_of(model))
        return [
            ServedModel(name, self._since[name], min(lengths[name], default=None), tasks[name])
            for name in sorted(lengths)
        ]

    def tasks(self, model: str | None) -> set[str]:
        """The tasks (EMBED, GENERATE) of the listed workers that serve `model` (None: of all
        listed workers), named as `serves` matches."""
        return {task_of(ref) for _, ref in self._listed() if model is None or model in _names(ref)}

    def serves(self, model: str | None) -> bool:
        """Whether a listed worker serves `model` (None: any model). A model is named as a
        worker knows it: its name, its digest, or (a path) the file's name or stem."""
        return any(model is None or model in _names(ref) for _, ref in self._listed())

    def tool_format(self, model: str | None) -> str:
        """The tool-call format of `model`'s chat template (None: any served model), as a
        listed worker serving it announced (`ModelRef.tool_format`); "" (tokenmill's default
        format) when none is listed."""
        for _, ref in self._listed():
            if model is None or model in _names(ref):
                return ref.tool_format
        return ""

    def find(self, model: str) -> ServedModel | None:
        """The listed model that `model` names (as `serves` matches), or None."""
        names = {ref.name for _, ref in self._listed() if model in _names(ref)}
        found = [m for m in self.models() if m.name in names]
        return found[0] if found else None

    def _listed(self) -> list[tuple[str, ModelRef]]:
        return [(w, ref) for w, ref in self._by_worker.items() if w not in self._hidden]


def task_of(ref: ModelRef) -> str:
    """EMBED for an embedding model, else GENERATE (a worker that predates the field too)."""
    return EMBED if ref.task == EMBED else GENERATE


def _names(ref: ModelRef) -> set[str]:
    path = PurePath(ref.name)
    return {ref.name, ref.digest, path.name, path.stem}


class FleetWatch:
    """Reads the events topic into a `Fleet` in a task of its own, from the beginning; every
    `refresh_s` seconds, checks it against the members of consumer group `group_id` (None or
    a `refresh_s` of 0: never). `clock`: the wall clock, which the events' `at` is read on."""

    def __init__(
        self,
        kafka: KafkaConnection,
        topic: str,
        group_id: str | None = None,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self.group_id = group_id
        self.refresh_s = refresh_s
        self.clock = clock
        self.fleet = Fleet()
        self.caught_up = False  # the topic read up to where it ended when this watch began
        self._task: asyncio.Task[None] | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway-fleet")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(), name="gateway-fleet-events")
            if self.group_id and self.refresh_s > 0:
                tg.create_task(self._check(self.group_id), name="gateway-fleet-group")

    async def _watch(self) -> None:
        record_reader.install()
        # No group: every partition, from the beginning (no offsets are ever committed);
        # a topic that does not exist yet is picked up when it appears.
        consumer = AIOKafkaConsumer(
            self.topic,
            **self.kafka.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await consumer.start()
        try:
            while True:
                fetched = await consumer.getmany(timeout_ms=1000)
                for records in fetched.values():
                    for record in records:
                        if (event := _decode(record.value, record.headers)) is not None:
                            self.fleet.apply(event)
                if not self.caught_up:
                    self.caught_up = await _at_end(consumer)
                    if self.caught_up:
                        log.info("fleet_read", topic=self.topic, models=len(self.fleet.models()))
        finally:
            await consumer.stop()

    def refuses(self, model: str | None) -> bool:
        """Whether a request for `model` (None: any) has no live worker to go to: the topic
        read to its end, and no listed worker serving it. Until the topic is read, nothing is
        refused (what it holds is not known yet)."""
        return self.caught_up and not self.fleet.serves(model)

    def other_task(self, model: str | None, task: str) -> str | None:
        """The task the listed workers serving `model` (None: every listed worker) do instead,
        when none of them does `task` (EMBED or GENERATE); None when one does, when none
        serves it (`refuses` says so) or while the topic is not read."""
        tasks = self.fleet.tasks(model) if self.caught_up else set()
        return None if not tasks or task in tasks else sorted(tasks)[0]

    async def _check(self, group_id: str) -> None:
        failing = False
        try:
            while True:
                await asyncio.sleep(self.refresh_s)
                try:
                    members = await self._members(group_id)
                # KafkaError, OSError and TimeoutError are what an outage or a missing ACL
                # raises; anything else (a client half through its bootstrap) says no more,
                # and must not stop the events' reading.
                except Exception as exc:
                    await self._close_admin()
                    if not failing:
                        log.warning("fleet_group_unread", group=group_id, error=repr(exc))
                    failing = True
                    continue
                if failing:
                    log.info("fleet_group_read", group=group_id)
                failing = False
                hidden = self.fleet.hidden
                self.fleet.list_only(members, self.clock(), self.refresh_s)
                if self.fleet.hidden != hidden:
                    log.info(
                        "fleet_workers_hidden", group=group_id, workers=sorted(self.fleet.hidden)
                    )
        finally:
            await self._close_admin()

    async def _members(self, group_id: str) -> set[str]:
        async with asyncio.timeout(_DESCRIBE_TIMEOUT_S):
            if self._admin is None:
                self._admin = AIOKafkaAdminClient(**self.kafka.client_kwargs())
                await self._admin.start()
            return group_workers(await self._admin.describe_consumer_groups([group_id]))

    async def _close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_DESCRIBE_TIMEOUT_S):
                    await admin.close()


def group_workers(responses: Iterable[Any]) -> set[str]:
    """The worker ids among the members of the groups in raw DescribeGroups `responses`
    (aiokafka's `describe_consumer_groups`); a group's error code raised as its KafkaError."""
    workers: set[str] = set()
    for response in responses:
        # (error_code, group, state, protocol_type, protocol, members[, authorized_operations])
        for error_code, group, _state, _type, _protocol, members, *_ in response.groups:
            if error_code:
                raise for_code(error_code)(f"describing group {group}")
            # member: (member_id, client_id, client_host, member_metadata, member_assignment)
            for _member_id, client_id, *_ in members:
                if client_id.startswith(CLIENT_PREFIX):
                    workers.add(client_id.removeprefix(CLIENT_PREFIX))
    return workers


async def _at_end(consumer: AIOKafkaConsumer) -> bool:
    """Whether `consumer` has read each of its partitions to its end (none assigned yet:
    no, the topic's partitions are not known)."""
    assigned = list(consumer.assignment())
    if not assigned:
        return False
    ends = await consumer.end_offsets(assigned)
    for tp in assigned:
        if await consumer.position(tp) < ends[tp]:
            return False
    return True


def _decode(value: bytes | None, headers: h.Headers) -> Event | None:
    try:
        ctype = normalize_content_type(h.header(headers, h.CONTENT_TYPE))
        return _event_codec.decode(value or b"", ctype)
    except (msgspec.DecodeError, MessageError, RecursionError):
        return None
