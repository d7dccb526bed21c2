"""A local Jaeger v2 (all-in-one, in-memory traces) run from the binary that
`ops/services/jaeger_build.py` makes, for development, the demo and the end-to-end tests.

    jaeger = LocalJaeger(state_dir, ui_port=16686, otlp_grpc_port=4317, otlp_http_port=4318)
    jaeger.start()        # True when started, False when one already ran from state_dir
    jaeger.ui_url         -> "http://127.0.0.1:16686"   (query API under /api)
    jaeger.otlp_http      -> "http://127.0.0.1:4318"    (OTEL_EXPORTER_OTLP_ENDPOINT)
    jaeger.stop()

Its collector config (written into the state dir) has one pipeline: OTLP gRPC and HTTP in,
batched, into in-memory storage (the newest `max_traces` traces) that the query extension
serves. Everything listens on 127.0.0.1 only, and the collector's own telemetry is off, so
it opens no port but the four above.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

from ops.errors import JaegerStartError
from ops.services.jaeger_build import jaeger_binary
from ops.services.local_process import accepts, bindable, free_port
from ops.services.local_service import LocalService

DEFAULT_UI_PORT = 16686
# Loopback requests must not go through an http_proxy from the environment.
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))
DEFAULT_OTLP_GRPC_PORT = 4317
DEFAULT_OTLP_HTTP_PORT = 4318


def render_config(
    *, ui_port: int, query_grpc_port: int, otlp_grpc_port: int, otlp_http_port: int,
    max_traces: int = 100_000,
) -> str:  # fmt: skip
    """The collector config (YAML) for in-memory Jaeger on these 127.0.0.1 ports."""
    return f"""\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {max_traces}
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{ui_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc_port}
      http:
        endpoint: 127.0.0.1:{otlp_http_port}
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


@dataclass
class LocalJaeger(LocalService):
    """The Jaeger whose config and log live in `state_dir`. At most one runs per state dir;
    `start()` adopts a running one, `stop()` stops whichever is recorded. Port 0: a free one."""

    ui_port: int = DEFAULT_UI_PORT
    otlp_grpc_port: int = DEFAULT_OTLP_GRPC_PORT
    otlp_http_port: int = DEFAULT_OTLP_HTTP_PORT
    query_grpc_port: int = 0

    _state_file = "jaeger.json"
    _port_fields = ("ui_port", "query_grpc_port", "otlp_grpc_port", "otlp_http_port")
    _output_file = "jaeger.log"
    _log_files = ("jaeger.log",)
    _log_lines = 20
    _title = "jaeger"
    _start_error = JaegerStartError

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.otlp_http_port}"

    def start(self, timeout: float = 60.0) -> bool:
        """Start Jaeger (building it first if needed) or adopt the running one; wait until its
        query API answers. True when this call started it. Raises `JaegerStartError` or
        `JaegerBuildError`."""
        return super().start(timeout)

    def stop(self, grace: float = 10.0) -> int | None:
        """Stop the state dir's Jaeger: SIGTERM, SIGKILL after `grace` s. Its pid, or None."""
        return super().stop(grace)

    def wait_ready(self, timeout: float = 60.0) -> None:
        super().wait_ready(timeout)

    def _ready(self) -> bool:
        """The query API answers and both OTLP receivers accept connections."""
        if not (accepts(self.otlp_grpc_port) and accepts(self.otlp_http_port)):
            return False
        try:
            with LOOPBACK.open(f"{self.ui_url}/api/services", timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _awaited(self) -> str:
        return f"jaeger's query API on {self.ui_url}"

    def _markers(self) -> tuple[str, ...]:
        return (str(self._path("config.yaml")),)

    def _command(self) -> list[str]:
        binary = jaeger_binary()
        for name in ("ui_port", "otlp_grpc_port", "otlp_http_port", "query_grpc_port"):
            if getattr(self, name) == 0:
                setattr(self, name, free_port())
        ports = (self.ui_port, self.otlp_grpc_port, self.otlp_http_port, self.query_grpc_port)
        taken = [port for port in ports if not bindable(port)]
        if taken:
            raise JaegerStartError(
                f"port(s) {', '.join(map(str, taken))} on 127.0.0.1 already in use; pick others "
                "or stop what listens there"
            )
        config = self._path("config.yaml")
        config.write_text(
            render_config(
                ui_port=self.ui_port,
                query_grpc_port=self.query_grpc_port,
                otlp_grpc_port=self.otlp_grpc_port,
                otlp_http_port=self.otlp_http_port,
            )
        )
        return [str(binary), "--config", str(config)]
