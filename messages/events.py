"""What workers publish on the events topic: lifecycle, swaps and status replies.

Every event names its worker and carries the unix time it happened (`at`). Durations are ms.
"""

from __future__ import annotations

import msgspec

from messages.result import ModelRef


class _Event(msgspec.Struct, kw_only=True, tag_field="type", forbid_unknown_fields=False):
    v: int = 1
    worker: str
    at: float
    command: str | None = None  # the nonce of the command this answers, if any


class WorkerStarted(_Event, tag="worker_started"):
    model: ModelRef
    group: str
    requests_topic: str
    max_model_len: int = 0  # the model's context, prompt and output (0: not said)


class WorkerDraining(_Event, tag="worker_draining"):
    reason: str
    in_flight: int


class WorkerStopped(_Event, tag="worker_stopped"):
    answered: int
    failed_on_shutdown: int


class ModelSwapStarted(_Event, tag="model_swap_started"):
    from_model: ModelRef
    to_model: str


class ModelSwapped(_Event, tag="model_swapped"):
    from_model: ModelRef
    to_model: ModelRef
    load_ms: float
    smoke_ms: float
    flip_ms: float
    drained: bool = False
    pause_ms: float = 0.0
    max_model_len: int = 0  # `to_model`'s context (0: not said)


class ModelSwapFailed(_Event, tag="model_swap_failed"):
    to_model: str
    reason: str


class CommandRefused(_Event, tag="command_refused"):
    reason: str


class StatusReply(_Event, tag="status_reply"):
    model: ModelRef
    uptime_s: float
    queued: int
    running: int
    kv_blocks_used: int
    kv_blocks_total: int
    standby: ModelRef | None = None  # the model a rollback would flip back to, when loaded
    draining: bool = False
    restarts: int = 0  # child restarts since the worker started
    max_model_len: int = 0  # `model`'s context (0: not said)


class ChildRestarted(_Event, tag="child_restarted"):
    child: str  # "ingest" | "gpu" | "emitter" | "control" | "http"
    error: str
    restarts: int  # within the restart window, this one included
    backoff_ms: float


Event = (
    WorkerStarted
    | WorkerDraining
    | WorkerStopped
    | ModelSwapStarted
    | ModelSwapped
    | ModelSwapFailed
    | CommandRefused
    | StatusReply
    | ChildRestarted
)
