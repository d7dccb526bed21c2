"""Worker settings from flags, `TOKENMILL_*` env vars and an optional TOML file.

Precedence: a flag beats its env var, which beats the TOML file, which beats the default.
The TOML file holds the same names as the flags, with underscores (`max_wait_ms = 5`),
either at the top level or under a `[worker]` table.
"""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from actors.config import (
    DEFAULT_CANCEL_TOPIC,
    DEFAULT_CONTROL_TOPIC,
    DEFAULT_DLQ_TOPIC,
    DEFAULT_EVENTS_TOPIC,
    DEFAULT_REQUESTS_TOPIC,
    DEFAULT_RESULTS_TOPIC,
    WorkerConfig,
    default_worker_id,
)
from actors.ingest.backpressure import Watermarks
from actors.streaming.policy import StreamPolicy
from ops.connection.options import SecretOption, kafka_connection, kafka_options


def default_models_dir() -> Path:
    from ops.models.registry import cache_dir

    return cache_dir() / "models"


def _load_toml(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if not value:
        return
    try:
        data = tomllib.loads(Path(value).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {value}: {exc}") from exc
    table = data.get("worker", data)
    # A TOML list (bucket_boundaries = [32, 64]) means what the comma-separated flag means.
    values = {
        k.replace("-", "_"): ",".join(map(str, v)) if isinstance(v, list) else v
        for k, v in table.items()
    }
    ctx.default_map = {**(ctx.default_map or {}), **values}


def _opt(*decls: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    name = decls[0].split("/")[0]
    kwargs.setdefault("envvar", "TOKENMILL_" + name.lstrip("-").replace("-", "_").upper())
    return click.option(*decls, show_default=True, show_envvar=True, **kwargs)


def worker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--config",
            type=click.Path(exists=True, dir_okay=False),
            envvar="TOKENMILL_CONFIG",
            is_eager=True,
            expose_value=False,
            callback=_load_toml,
            help="TOML file with any of these settings (env TOKENMILL_CONFIG).",
        ),
        kafka_options,
        _opt("--group", default="tokenmill", help="Consumer group."),
        _opt(
            "--group-instance-id",
            default=None,
            help="Static membership (KIP-345): a stable name per worker, unique in the group "
            "(`{hostname}` is replaced by the host's name: a StatefulSet pod's or a container's). "
            "Restarted within the session timeout, it gets its partitions back and no other "
            "worker's assignment moves.",
        ),
        _opt(
            "--session-timeout-ms",
            type=int,
            default=10_000,
            help="How long the group waits for a silent worker before moving its partitions.",
        ),
        _opt(
            "--connect-timeout",
            type=float,
            default=None,
            help="Seconds to wait for the broker at start before exiting 1 [default: wait "
            "as long as it takes, not ready meanwhile].",
        ),
        _opt("--requests-topic", default=DEFAULT_REQUESTS_TOPIC),
        _opt("--results-topic", default=DEFAULT_RESULTS_TOPIC, help="Default reply topic."),
        _opt("--dlq-topic", default=DEFAULT_DLQ_TOPIC),
        _opt("--worker-id", default=None, help="Default: host-pid."),
        _opt("--max-request-bytes", type=int, default=1 << 20),
        _opt(
            "--max-message-bytes",
            type=int,
            default=None,
            help="Largest record the worker produces (default: 4 MiB, more if dead letters "
            "need it); the largest possible result must fit, checked at start.",
        ),
        _opt(
            "--delivery-timeout-ms",
            type=int,
            default=40_000,
            help="How long a result's send may take before it is sent again (the broker is "
            "waited for as long as it is away).",
        ),
        _opt(
            "--allowed-reply-to",
            default="*.results",
            help="Comma-separated patterns (fnmatch) a request's reply_to may match, beside "
            "the results topic; internal (__*) and the worker's own topics never.",
        ),
        _opt("--max-batch-tokens", type=int, default=8192, help="Bucket flush: tokens."),
        _opt("--max-batch-size", type=int, default=64, help="Bucket flush: requests."),
        _opt("--max-wait-ms", type=float, default=10.0, help="Bucket flush: oldest wait."),
        _opt(
            "--bucket-boundaries",
            default=None,
            help="Comma-separated prompt lengths (default: powers of two to max_model_len).",
        ),
        _opt("--high-watermark-requests", type=int, default=512, help="Pause above this."),
        _opt("--high-watermark-tokens", type=int, default=262144, help="Pause above this."),
        _opt("--shutdown-timeout", type=float, default=30.0, help="Seconds to drain."),
        _opt("--commit-interval", type=float, default=1.0, help="Seconds between commits."),
        _opt("--log-level", default="info"),
        _opt(
            "--log-sample-rate",
            type=click.FloatRange(0, 1),
            default=0.01,
            help="Share of successful requests logged (request_done); failures always are.",
        ),
        _opt("--http-port", type=int, default=9464, help="/healthz, /readyz, /metrics; -1: off."),
        _opt("--http-host", default="0.0.0.0", help="Address the HTTP server binds."),
        _opt("--control-topic", default=DEFAULT_CONTROL_TOPIC, help="Signed commands; '': off."),
        _opt("--events-topic", default=DEFAULT_EVENTS_TOPIC, help="Lifecycle and swap events."),
        _opt("--cancel-topic", default=DEFAULT_CANCEL_TOPIC, help="Cancel records; '': off."),
        _opt(
            "--control-secret",
            cls=SecretOption,
            default=None,
            help="Shared HMAC secret of control commands (unset: every command is refused).",
        ),
        _opt(
            "--models-dir",
            default=None,
            help="Swaps may load only from here (default: the model cache).",
        ),
        _opt(
            "--swap-memory-budget",
            type=int,
            default=None,
            help="Bytes all loaded models + KV may use (default: free device memory decides).",
        ),
        _opt(
            "--keep-previous-model/--no-keep-previous-model",
            default=True,
            help="Keep the old model loaded after a swap so rollback is a flip.",
        ),
        _opt("--max-restarts", type=int, default=5, help="Crashes of one actor per window."),
        _opt("--restart-window", type=float, default=60.0, help="Seconds; then drain, exit 1."),
        _opt(
            "--max-record-crashes",
            type=int,
            default=3,
            help="Workers that may die in a row with a record in flight before it is "
            "quarantined (answered `quarantined`, sent to the DLQ, never run again).",
        ),
        _opt(
            "--stream-interval-tokens",
            type=click.IntRange(min=1),
            default=16,
            help="Streamed requests naming none: a chunk after this many new tokens...",
        ),
        _opt(
            "--stream-interval-ms",
            type=click.FloatRange(min=0),
            default=200.0,
            help="...or this long after the previous chunk, whichever comes first.",
        ),
        _opt(
            "--stream-min-interval-ms",
            type=click.FloatRange(min=0),
            default=20.0,
            help="No two chunks of one request closer than this, whatever it asks.",
        ),
        _opt(
            "--log-payloads",
            is_flag=True,
            default=False,
            help="Put prompts and outputs in request logs (off: never logged).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def instance_id(value: str | None) -> str | None:
    """`--group-instance-id` with `{hostname}` expanded; None or empty: dynamic membership."""
    return value.replace("{hostname}", socket.gethostname()) if value else None


def worker_config(kwargs: dict[str, Any]) -> WorkerConfig:
    """Pop the worker options out of a command's kwargs; bad values become usage errors."""
    try:
        boundaries = kwargs.pop("bucket_boundaries")
        return WorkerConfig(
            kafka=kafka_connection(kwargs),
            group=kwargs.pop("group"),
            group_instance_id=instance_id(kwargs.pop("group_instance_id")),
            session_timeout_ms=kwargs.pop("session_timeout_ms"),
            connect_timeout_s=kwargs.pop("connect_timeout"),
            requests_topic=kwargs.pop("requests_topic"),
            results_topic=kwargs.pop("results_topic"),
            dlq_topic=kwargs.pop("dlq_topic"),
            worker_id=kwargs.pop("worker_id") or default_worker_id(),
            max_request_bytes=kwargs.pop("max_request_bytes"),
            max_message_bytes=kwargs.pop("max_message_bytes"),
            delivery_timeout_ms=kwargs.pop("delivery_timeout_ms"),
            allowed_reply_to=tuple(
                p.strip() for p in str(kwargs.pop("allowed_reply_to") or "").split(",") if p.strip()
            ),
            max_batch_tokens=kwargs.pop("max_batch_tokens"),
            max_batch_size=kwargs.pop("max_batch_size"),
            max_wait_ms=kwargs.pop("max_wait_ms"),
            bucket_boundaries=(
                tuple(int(b) for b in str(boundaries).split(",")) if boundaries else None
            ),
            watermarks=Watermarks(
                high_requests=kwargs.pop("high_watermark_requests"),
                high_tokens=kwargs.pop("high_watermark_tokens"),
            ),
            shutdown_timeout_s=kwargs.pop("shutdown_timeout"),
            commit_interval_s=kwargs.pop("commit_interval"),
            log_sample_rate=kwargs.pop("log_sample_rate"),
            log_payloads=kwargs.pop("log_payloads"),
            http_port=http_port if (http_port := kwargs.pop("http_port")) >= 0 else None,
            http_host=kwargs.pop("http_host"),
            control_topic=kwargs.pop("control_topic") or None,
            events_topic=kwargs.pop("events_topic"),
            control_secret=kwargs.pop("control_secret") or None,
            cancel_topic=kwargs.pop("cancel_topic") or None,
            models_dir=kwargs.pop("models_dir") or str(default_models_dir()),
            swap_memory_budget_bytes=kwargs.pop("swap_memory_budget"),
            keep_previous_model=kwargs.pop("keep_previous_model"),
            max_restarts=kwargs.pop("max_restarts"),
            restart_window_s=kwargs.pop("restart_window"),
            max_record_crashes=kwargs.pop("max_record_crashes"),
            streaming=StreamPolicy(
                interval_tokens=kwargs.pop("stream_interval_tokens"),
                interval_ms=kwargs.pop("stream_interval_ms"),
                min_interval_ms=kwargs.pop("stream_min_interval_ms"),
            ),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
