"""The pure parts of `ops.services.kafka` and `ops.services.kafka_jars`: nothing here starts a
broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.errors import JavaNotFound, MavenError
from ops.services.kafka import MAX_MESSAGE_BYTES, render_log4j2, render_server_properties
from ops.services.kafka_jars import (
    MARKER,
    find_java,
    kafka_libs_dir,
    parse_java_major,
    render_pom,
    resolve_kafka_jars,
)


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def test_server_properties_one_combined_kraft_node() -> None:
    props = _properties(
        render_server_properties(port=19092, controller_port=19093, log_dir=Path("/s/data"))
    )

    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == "/s/data"
    assert props["offsets.topic.replication.factor"] == "1"


def test_server_properties_let_a_10_mb_message_through() -> None:
    props = _properties(render_server_properties(port=1, controller_port=2, log_dir=Path("/d")))

    assert int(props["message.max.bytes"]) == MAX_MESSAGE_BYTES > 10_000_000
    assert int(props["replica.fetch.max.bytes"]) == MAX_MESSAGE_BYTES


def test_log4j2_writes_to_the_given_file() -> None:
    config = _properties(render_log4j2(Path("/s/server.log")).replace(" = ", "="))

    assert config["appender.file.fileName"] == "/s/server.log"
    assert config["rootLogger.level"] == "INFO"


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
        ('java version "1.8.0_292"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "25-ea" 2025-09-16', 25),
    ],
)
def test_parse_java_major(output: str, major: int) -> None:
    assert parse_java_major(output) == major


def test_parse_java_major_rejects_garbage() -> None:
    with pytest.raises(JavaNotFound, match="cannot read a Java version"):
        parse_java_major("bash: java: command not found")


def test_find_java_rejects_a_java_home_without_java(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))

    with pytest.raises(JavaNotFound, match="has no bin/java"):
        find_java()


def test_find_java_rejects_java_11(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))

    with pytest.raises(JavaNotFound, match=r"is Java 11; .* needs Java 17"):
        find_java()


def test_pom_pins_kafka_and_the_slf4j1_log4j2_binding() -> None:
    pom = render_pom("4.1.1", "2.24.3")

    assert "<artifactId>kafka_2.13</artifactId><version>4.1.1</version>" in pom
    assert "<artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version>" in pom
    assert "<artifactId>log4j-core</artifactId><version>2.24.3</version>" in pom


def test_resolved_jars_are_reused_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no mvn to run
    libs = kafka_libs_dir("4.1.1")
    libs.mkdir(parents=True)
    (libs / MARKER).write_text("kafka_2.13-4.1.1.jar\n")

    assert resolve_kafka_jars("4.1.1") == libs


def test_unresolved_jars_without_maven_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    kafka_libs_dir("4.1.1").mkdir(parents=True)  # an interrupted layout: no marker

    with pytest.raises(MavenError, match="`mvn`"):
        resolve_kafka_jars("4.1.1")
