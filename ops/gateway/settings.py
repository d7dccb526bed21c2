"""The gateway's settings, declared once (`ops/settings.py` derives flags, env vars, TOML keys)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from actors.config import (
    DEFAULT_CANCEL_TOPIC,
    DEFAULT_EVENTS_TOPIC,
    DEFAULT_REQUESTS_TOPIC,
    WorkerConfig,
)

_TOPIC_PART = re.compile(r"[A-Za-z0-9._-]{1,100}")
REPLY_TOPIC_PATTERN = "tokenmill.gateway.{instance}.results"  # matches the workers' `*.results`
BATCH_REPLY_TOPIC_PATTERN = "tokenmill.gateway.{instance}.batches.results"  # and so does this


@dataclass(frozen=True)
class GatewaySettings:
    """What `tokenmill gateway` serves, and where its requests go."""

    host: str = field(
        default="127.0.0.1",
        metadata={"help": "Address to listen on; beyond loopback, --api-key-file is required."},
    )
    port: int = field(default=8000, metadata={"help": "HTTP port."})
    api_key_file: str | None = field(
        default=None,
        metadata={
            "help": "A file of API keys, one a line ('#' comments); clients send "
            "`Authorization: Bearer KEY`. None: no key asked (loopback only).",
            "file": True,
        },
    )
    max_inflight: int = field(
        default=256,
        metadata={"help": "Requests in flight at once; past it, 429 with Retry-After."},
    )
    request_timeout: float = field(
        default=600.0,
        metadata={"help": "Seconds to wait for a result; then 504 and a cancel record."},
    )
    max_body_bytes: int = field(
        default=1_048_576, metadata={"help": "Largest request body accepted; larger: 413."}
    )
    requests_topic: str = field(
        default=DEFAULT_REQUESTS_TOPIC, metadata={"help": "Where requests are produced."}
    )
    cancel_topic: str = field(
        default=DEFAULT_CANCEL_TOPIC,
        metadata={"help": "Where cancels go (timeouts, clients that disconnect)."},
    )
    events_topic: str = field(
        default=DEFAULT_EVENTS_TOPIC,
        metadata={"help": "The workers' events, read for GET /v1/models."},
    )
    group: str = field(
        default=WorkerConfig.group,  # a dataclass field's default, as a class attribute
        metadata={
            "help": "The workers' consumer group (their --group): GET /v1/models lists only "
            "workers whose ingest consumer is a member, or that were heard from lately."
        },
    )
    models_refresh: float = field(
        default=30.0,
        metadata={
            "help": "Seconds between checks of --group's members; a worker gone from the "
            "group, silent this long, leaves GET /v1/models (0: never checked)."
        },
    )
    instance_id: str | None = field(
        default=None,
        metadata={"help": "This instance's name in its reply topic [default: random]."},
    )
    reply_partitions: int = field(
        default=3, metadata={"help": "Partitions of the reply topic the gateway creates."}
    )
    default_max_tokens: int | None = field(
        default=None,
        metadata={
            "help": "max_tokens for bodies without one, chat and completions alike [default: "
            "completions 16; chat runs to EOS, the worker's --max-new-tokens-limit or the "
            "context's end]."
        },
    )
    strict_fields: bool = field(
        default=False,
        metadata={
            "help": "Refuse a body field the gateway does not know (400 unsupported_parameter) "
            "instead of ignoring it (logged, and named in x-tokenmill-ignored-fields)."
        },
    )

    allowed_origins: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Origins a browser may call from (CORS), comma-separated; `*`: any "
            "[default: none, no CORS headers].",
        },
    )

    batch_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where /v1/files and /v1/batches keep their files and batches; a batch "
            "left unfinished resumes when a gateway starts on it again [default: "
            "$XDG_STATE_HOME/tokenmill/gateway, else ~/.local/state/tokenmill/gateway].",
        },
    )
    batch_max_inflight: int = field(
        default=64,
        metadata={"help": "Requests in flight at once for each running batch."},
    )
    batch_max_running: int = field(
        default=4,
        metadata={"help": "Batches this instance runs at once; the others wait, oldest first."},
    )
    max_file_bytes: int = field(
        default=1 << 30,
        metadata={"help": "Largest file upload accepted (POST /v1/files); larger: 413."},
    )

    def __post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError("--max-inflight must be at least 1")
        if not self.request_timeout > 0:
            raise ValueError("--request-timeout must be positive")
        if self.batch_max_running < 1:
            raise ValueError("--batch-max-running must be at least 1")
        if self.batch_max_inflight < 1:
            raise ValueError("--batch-max-inflight must be at least 1")
        if self.max_file_bytes < 1:
            raise ValueError("--max-file-bytes must be positive")
        if not self.models_refresh >= 0:  # NaN too
            raise ValueError("--models-refresh must be 0 or more")
        if self.max_body_bytes < 1:
            raise ValueError("--max-body-bytes must be positive")
        if not 0 <= self.port < 65536:
            raise ValueError("--port must be in 0..65535")
        if self.instance_id is not None and not _TOPIC_PART.fullmatch(self.instance_id):
            raise ValueError("--instance-id may hold only letters, digits, '.', '_' and '-'")

    def reply_topic(self, instance: str) -> str:
        return REPLY_TOPIC_PATTERN.format(instance=instance)

    def batch_reply_topic(self, instance: str) -> str:
        return BATCH_REPLY_TOPIC_PATTERN.format(instance=instance)

    def batch_root(self) -> Path:
        if self.batch_dir:
            return Path(self.batch_dir).expanduser()
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(state) / "tokenmill" / "gateway"
