"""The docker compose stack in compose/: it validates, and it is wired the way its README says.

No container starts. `docker-compose config` (Debian's 1.29.2 in CI, installed by
ops/install_compose_checker.sh) resolves and validates the compose file; without it that test
skips, unless TOKENMILL_REQUIRE_COMPOSE=1 (CI sets it) makes the absence a failure. The other
tests read the files themselves: the GPU worker, Prometheus' targets, the Dockerfile, and the
Grafana dashboard, whose queries may use only the metric names the worker's /metrics is to
expose (the contract listed in compose/README.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops.services.topics import DEFAULT_TOPICS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
DASHBOARD = COMPOSE / "grafana" / "dashboards" / "tokenmill.json"
METRICS_PORT = 9464

SERVICES = {
    "kafka", "topics", "jaeger", "worker", "worker-gpu", "gateway", "prometheus", "grafana"
}  # fmt: skip

# The worker's /metrics contract: what the dashboard may read (histograms by base name).
CONTRACT_METRICS = {
    "tokenmill_generated_tokens_total",
    "tokenmill_requests_total",
    "tokenmill_batch_size",
    "tokenmill_batch_tokens",
    "tokenmill_kv_usage_ratio",
    "tokenmill_kv_blocks_used",
    "tokenmill_kv_blocks_total",
    "tokenmill_kv_blocks_cached",
    "tokenmill_kv_prefix_hit_ratio",
    "tokenmill_kv_prefix_hit_tokens_total",
    "tokenmill_kv_prefix_miss_tokens_total",
    "tokenmill_cancels_total",
    "tokenmill_retries_total",
    "tokenmill_stream_chunks_total",
    "tokenmill_ttft_seconds",
    "tokenmill_tpot_seconds",
    "tokenmill_request_duration_seconds",
    "tokenmill_queue_depth",
    "tokenmill_consumer_lag",
    "tokenmill_bucket_flushes_total",
    "tokenmill_preemptions_total",
}

# What an operator must find on the dashboard: signal -> a pattern some query must match.
KEY_SIGNALS = {
    "tokens/s": r"rate\(tokenmill_generated_tokens_total\[",
    "batch size": r"tokenmill_batch_size_bucket",
    "KV usage": r"tokenmill_kv_usage_ratio",
    "KV prefix hit ratio": r"tokenmill_kv_prefix_hit_ratio",
    "TTFT": r"histogram_quantile\(0\.99, .*tokenmill_ttft_seconds_bucket",
    "TPOT": r"histogram_quantile\(0\.99, .*tokenmill_tpot_seconds_bucket",
    "queue depth": r"tokenmill_queue_depth",
    "consumer lag": r"sum by \(partition\) \(tokenmill_consumer_lag\)",
    "errors": r'sum by \(code\) \(rate\(tokenmill_requests_total\{outcome="error"\}',
}

_METRIC_NAME = re.compile(r"tokenmill_[a-z_]+")


def _compose_file() -> dict[str, Any]:
    """The compose file as written (YAML anchors and merge keys resolved by PyYAML)."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def _service(name: str) -> dict[str, Any]:
    service: dict[str, Any] = _compose_file()["services"][name]
    return service


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def _metric_names(query: str) -> set[str]:
    return {name.removesuffix("_bucket") for name in _METRIC_NAME.findall(query)}


def _docker_compose() -> str:
    """The docker-compose executable; skips (or fails, where CI requires it) when missing."""
    exe = shutil.which("docker-compose")
    if exe is not None:
        return exe
    if os.environ.get("TOKENMILL_REQUIRE_COMPOSE") == "1":
        pytest.fail(
            "docker-compose is not on PATH and TOKENMILL_REQUIRE_COMPOSE=1: "
            "run ops/install_compose_checker.sh"
        )
    pytest.skip("docker-compose is not installed (ops/install_compose_checker.sh installs it)")


def test_docker_compose_config_validates_the_stack() -> None:
    exe = _docker_compose()
    # --profile gpu, so that worker-gpu is resolved and validated too.
    proc = subprocess.run(
        [exe, "-f", str(COMPOSE_FILE), "--profile", "gpu", "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert set(resolved["services"]) == SERVICES
    assert resolved["services"]["worker-gpu"]["profiles"] == ["gpu"]


def test_every_image_is_pinned_to_a_version_tag() -> None:
    for name, service in _compose_file()["services"].items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image} is not pinned"


def test_worker_is_the_default_and_the_gpu_worker_needs_the_gpu_profile() -> None:
    profiled = {
        name: service["profiles"]
        for name, service in _compose_file()["services"].items()
        if "profiles" in service
    }
    assert profiled == {"worker-gpu": ["gpu"], "gateway": ["gateway"]}


def test_gpu_worker_reserves_an_nvidia_gpu_and_runs_on_cuda() -> None:
    gpu = _service("worker-gpu")
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    (device,) = devices
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert device.get("count") == 1 or device.get("count") == "all"
    assert gpu["command"][-2:] == ["--device", "cuda"]
    assert gpu["build"] == _service("worker")["build"]


def test_worker_waits_for_the_topics_and_reaches_kafka_and_jaeger_by_name() -> None:
    worker = _service("worker")
    assert worker["build"] == {"context": "..", "dockerfile": "compose/Dockerfile"}
    assert worker["command"] == ["worker", "--model", "smollm2-135m"]  # ENTRYPOINT tokenmill
    assert worker["depends_on"]["topics"] == {"condition": "service_completed_successfully"}
    assert worker["environment"] == {
        "TOKENMILL_BOOTSTRAP_SERVERS": "kafka:9092",
        "TOKENMILL_GROUP_INSTANCE_ID": "worker-{hostname}",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318",
        "OTEL_SERVICE_NAME": "tokenmill",
    }
    assert str(METRICS_PORT) in worker["expose"]


def test_topics_service_creates_the_topics_tokenmill_topics_create_makes() -> None:
    topics = _service("topics")
    assert topics["depends_on"]["kafka"] == {"condition": "service_healthy"}
    assert "healthcheck" in _service("kafka")
    script = topics["command"][-1]
    assert "/opt/kafka/bin/kafka-topics.sh" in script
    assert "--if-not-exists" in script
    created = dict(re.findall(r"create (tokenmill\.\S+) --partitions (\d+)", script))
    wide = {DEFAULT_TOPICS["requests"], DEFAULT_TOPICS["results"]}
    assert created == {name: "6" if name in wide else "1" for name in DEFAULT_TOPICS.values()}


def test_prometheus_scrapes_the_workers_metrics_port() -> None:
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    targets = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets.update(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets.update(f"{name}:{dns['port']}" for name in dns["names"])
    assert {f"worker:{METRICS_PORT}", f"worker-gpu:{METRICS_PORT}"} <= targets
    assert config["global"]["scrape_interval"] == "5s"


def test_grafana_provisions_prometheus_under_the_uid_the_dashboard_uses() -> None:
    provisioning = COMPOSE / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "datasources.yml").read_text())
    (source,) = sources["datasources"]
    assert (source["uid"], source["type"]) == ("prometheus", "prometheus")
    assert source["url"] == "http://prometheus:9090"

    dashboard = json.loads(DASHBOARD.read_text())
    assert (dashboard["uid"], dashboard["title"]) == ("tokenmill", "tokenmill")
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "prometheus", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "prometheus", panel["title"]


def test_dashboard_queries_only_contract_metrics() -> None:
    for query in _dashboard_queries():
        unknown = _metric_names(query) - CONTRACT_METRICS
        assert not unknown, f"{query!r} reads metrics outside the contract: {sorted(unknown)}"


def test_dashboard_covers_the_key_signals() -> None:
    queries = _dashboard_queries()
    missing = [
        signal
        for signal, pattern in KEY_SIGNALS.items()
        if not any(re.search(pattern, query) for query in queries)
    ]
    assert not missing, f"no panel shows {missing}"


def test_compose_readme_lists_every_contract_metric() -> None:
    readme = (COMPOSE / "README.md").read_text()
    assert set(_METRIC_NAME.findall(readme)) == CONTRACT_METRICS


def test_dockerfile_syncs_the_lockfile_and_runs_as_a_non_root_user() -> None:
    lines = [line.strip() for line in (COMPOSE / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "no USER line"
    assert users[-1] not in {"root", "0"} and not users[-1].startswith(("root:", "0:"))
    assert any(line.startswith("RUN uv sync --locked") for line in lines)
    assert 'ENTRYPOINT ["tokenmill"]' in lines
    assert f"EXPOSE {METRICS_PORT}" in lines
