"""`tokenmill worker`'s settings: `WorkerConfig`'s and this command's own, each declared once
as a dataclass field, read from flags, `TOKENMILL_*` env vars and an optional TOML file
(`ops/settings.py`).

Precedence: a flag beats its env var, which beats the TOML file, which beats the default.
The TOML file holds the settings by name (`max_wait_ms = 5`), at the top level or under a
`[worker]` table.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from actors.config import WorkerConfig
from ops.connection.options import kafka_connection, kafka_options
from ops.settings import build, config_file_option, options

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class WorkerCommand:
    """What the command takes beside the worker's and the engine's settings."""

    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error."})
    engine: str = field(
        default="torch",
        metadata={
            "help": "echo: benchmark only, returns the prompt tokens.",
            "choices": ("torch", "echo"),
        },
    )


def default_models_dir() -> Path:
    from ops.models.registry import cache_dir

    return cache_dir() / "models"


def worker_options(command: F) -> F:
    """The worker's settings as options of `command`: the TOML file, `WorkerCommand`'s, the
    Kafka connection's and `WorkerConfig`'s."""
    command = kafka_options(options(WorkerConfig)(command))
    return config_file_option("worker")(options(WorkerCommand)(command))


def instance_id(value: str | None) -> str | None:
    """`--group-instance-id` with `{hostname}` expanded; None or empty: dynamic membership."""
    return value.replace("{hostname}", socket.gethostname()) if value else None


def worker_config(values: dict[str, Any]) -> WorkerConfig:
    """Pop `WorkerConfig`'s settings out of a command's option values; bad values become usage
    errors."""
    values["group_instance_id"] = instance_id(values["group_instance_id"])
    values["models_dir"] = values["models_dir"] or str(default_models_dir())
    return build(WorkerConfig, values, kafka=kafka_connection(values))
