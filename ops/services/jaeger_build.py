"""The Jaeger binary the local tracing backend runs: Jaeger v2, built once with Go.

    jaeger_binary()   -> ~/.cache/tokenmill/jaeger/v1.76.0/bin/jaeger (built on first use)

The Go module tag v1.76.0 of github.com/jaegertracing/jaeger is Jaeger v2's all-in-one
(`cmd/jaeger`, an OpenTelemetry Collector distribution). `go install …@v1.76.0` refuses it
(its go.mod has replace directives), so it is built as a tool of a scratch module:
`go mod init` → `go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0` → `go build`.
The binary is written beside its final place and renamed into it; a file lock keeps two
processes from building at once. About 4 minutes on 2 cores the first time.

The Go build carries no UI assets (Jaeger's release builds add them with npm): the query
API (`/api/...`) works, the web UI at `/` shows Jaeger's placeholder page.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ops.errors import JaegerBuildError
from ops.models.registry import cache_dir
from ops.services.kafka_jars import file_lock

JAEGER_MODULE = "github.com/jaegertracing/jaeger"
JAEGER_VERSION = "v1.76.0"
_BUILD_TIMEOUT_S = 1800.0


def jaeger_binary_path(version: str = JAEGER_VERSION) -> Path:
    return cache_dir() / "jaeger" / version / "bin" / "jaeger"


def is_built(version: str = JAEGER_VERSION) -> bool:
    return jaeger_binary_path(version).is_file()


def jaeger_binary(version: str = JAEGER_VERSION) -> Path:
    """The cached binary, built with Go first if absent. Raises `JaegerBuildError`."""
    binary = jaeger_binary_path(version)
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(binary.parent.parent / ".lock"):
        if not binary.is_file():  # another process may have built it while we waited
            _build(version, binary)
    return binary


def _build(version: str, binary: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise JaegerBuildError(
            "Go (`go`) is not on PATH; it is needed once to build Jaeger "
            f"({JAEGER_MODULE}/cmd/jaeger@{version}) into {binary.parent}"
        )
    staged = binary.with_name(f".jaeger-{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="tokenmill-jaeger-build-") as scratch:
        steps = [
            [go, "mod", "init", "tokenmill.local/jaeger-build"],
            [go, "get", "-tool", f"{JAEGER_MODULE}/cmd/jaeger@{version}"],
            [go, "build", "-o", str(staged), f"{JAEGER_MODULE}/cmd/jaeger"],
        ]
        for argv in steps:
            _run(argv, Path(scratch))
    os.replace(staged, binary)


def _run(argv: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise JaegerBuildError(f"`{' '.join(argv[1:3])}` ran past {exc.timeout:.0f} s") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-3000:]
        raise JaegerBuildError(
            f"`go {' '.join(argv[1:])}` failed (exit {done.returncode}):\n{output}"
        )
