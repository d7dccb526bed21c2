"""How the benches take their Kafka connection: given (`--bootstrap-servers` or
`--kafka-config`) or None (a broker started for the run); handed to the worker as flags with
its secrets in env vars; reported without a secret."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from actors.kafka.connection import KafkaConnection
from gpu.engine_config import EngineConfig
from ops.bench.cli import bench
from ops.bench.cli_options import bench_kafka
from ops.bench.rig import Rig, child_env, worker_argv
from ops.models.engine_options import EngineChoice

SECRET = "pw-Hx7-unlikely"
SCRAM = KafkaConnection(
    "broker:9093",
    security_protocol="SASL_PLAINTEXT",
    sasl_mechanism="SCRAM-SHA-256",
    sasl_username="svc",
    sasl_password=SECRET,
)


def _connection(monkeypatch: pytest.MonkeyPatch, *args: str) -> KafkaConnection | None:
    """`bench batch`'s connection from these flags alone (no TOKENMILL_* from this env)."""
    for name in [n for n in os.environ if n.startswith("TOKENMILL_")]:
        monkeypatch.delenv(name)
    with bench.commands["batch"].make_context("batch", list(args)) as ctx:
        return bench_kafka(dict(ctx.params))


def test_no_broker_given_means_start_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _connection(monkeypatch) is None


def test_a_given_broker_brings_the_other_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = _connection(monkeypatch, "--bootstrap-servers", "b:9092", "--compression-type", "zstd")
    assert given == KafkaConnection("b:9092", compression_type="zstd")
    config = tmp_path / "client.properties"
    config.write_text("bootstrap.servers=c:9092\n")
    assert _connection(monkeypatch, "--kafka-config", str(config)) == KafkaConnection("c:9092")


def test_settings_without_a_broker_are_a_usage_error() -> None:
    env = {n: None for n in os.environ if n.startswith("TOKENMILL_")}
    result = CliRunner().invoke(bench, ["batch", "--compression-type", "lz4"], env=env)
    assert result.exit_code == 2
    assert "compression_type given without --bootstrap-servers" in result.output


def test_the_worker_gets_the_connection_with_its_secrets_off_the_command_line() -> None:
    choice = EngineChoice(model="m", dtype=None, device=None, engine=EngineConfig())
    topics = {"requests": "r", "results": "s", "dlq": "d"}
    argv, env = worker_argv(choice, "echo", SCRAM, topics)

    flags = argv[argv.index("worker") + 1 :]
    assert flags[flags.index("--bootstrap-servers") + 1] == "broker:9093"
    assert flags[flags.index("--sasl-mechanism") + 1] == "SCRAM-SHA-256"
    assert not any(SECRET in arg for arg in argv)
    assert env == {"TOKENMILL_SASL_PASSWORD": SECRET}
    assert child_env(env)["TOKENMILL_SASL_PASSWORD"] == SECRET


def test_the_report_names_the_broker_never_a_secret(tmp_path: Path) -> None:
    facts = Rig(SCRAM, True, None, tmp_path, print, partitions=2).facts()
    assert facts == {
        "broker": "given",
        "bootstrap": "broker:9093",
        "partitions": 2,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
    }
    started = Rig(KafkaConnection("127.0.0.1:40000"), False, 123, tmp_path, print).facts()
    assert started["broker"] == "started for this run, on this machine"
    assert "sasl_mechanism" not in started
