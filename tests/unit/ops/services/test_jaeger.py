"""The local Jaeger's config and build, without running it (tests/e2e runs the real one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ops.errors import JaegerBuildError
from ops.services.jaeger import render_config
from ops.services.jaeger_build import jaeger_binary, jaeger_binary_path


def test_the_config_listens_on_loopback_only_and_on_the_given_ports() -> None:
    config = render_config(
        ui_port=1001, query_grpc_port=1002, otlp_grpc_port=1003, otlp_http_port=1004
    )
    endpoints = re.findall(r"endpoint: (\S+)", config)
    assert endpoints == ["127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003", "127.0.0.1:1004"]
    assert "level: none" in config, "the collector's own metrics port stays closed"
    assert "max_traces: 100000" in config


def test_without_go_the_build_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert jaeger_binary_path().is_relative_to(tmp_path)
    with pytest.raises(JaegerBuildError, match=r"Go \(`go`\) is not on PATH"):
        jaeger_binary()
    assert not jaeger_binary_path().exists()
