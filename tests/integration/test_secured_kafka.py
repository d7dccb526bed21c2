"""tokenmill on a secured Kafka: the worker and every command through SASL_SSL (SCRAM-SHA-512),
SASL_PLAINTEXT (PLAIN) and mTLS listeners of a real broker, configured only by the client
properties file the broker's `tokenmill up --security` wrote; a foreign client (librdkafka)
reading the same file; and each wrong setting failing fast with one line naming its cause.

The tests' own producers and readers use the broker's plaintext listener (what is under test
is tokenmill's side of the connection).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ops.services.kafka import LocalKafka
from ops.services.local_process import free_port
from ops.services.topics import create_topics
from tests.integration.pipeline import REPO, Lane, WorkerProcess, new_lane, results_by_id
from tests.integration.test_supervision import http_get, wait_ready

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"  # the echo engine reads only its config and tokenizer
SECRET = "control-secret-for-the-secured-lane"


def read_properties(path: Path) -> dict[str, str]:
    """A librdkafka config dict from a properties file (as a foreign client loads one)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


def connection_args(kafka: LocalKafka, kind: str) -> list[str]:
    return ["--kafka-config", str(kafka.client_properties(kind))]


async def tokenmill(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ops",
        *args,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(300):  # a hang bound only
        out, err = await process.communicate()
    assert process.returncode is not None
    return subprocess.CompletedProcess(args, process.returncode, out.decode(), err.decode())


async def secured_worker(
    kafka: LocalKafka, kind: str, lane: Lane, log: Path, *extra: str
) -> WorkerProcess:
    # The lane's arguments name its plaintext address; the file's (given after) wins.
    worker = WorkerProcess(
        lane,
        MODEL,
        log,
        extra=[
            "--engine",
            "echo",
            *connection_args(kafka, kind),
            "--bootstrap-servers",
            kafka.listener(kind),
            *extra,
        ],
    ).start()
    await worker.wait_for_log("partitions_assigned", within_s=240)
    return worker


@pytest.mark.parametrize("kind", ["sasl_ssl", "sasl_plaintext", "mtls"])
async def test_a_worker_submit_batch_and_status_through_a_secured_listener(
    kind: str, secured_kafka: LocalKafka, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(secured_kafka.bootstrap, partitions=1)
    control, events = f"{lane.group}.control", f"{lane.group}.events"
    await create_topics(secured_kafka.bootstrap, names={"control": control, "events": events})
    worker = await secured_worker(
        secured_kafka,
        kind,
        lane,
        tmp_path / "worker.log",
        "--control-topic",
        control,
        "--events-topic",
        events,
        "--control-secret",
        SECRET,
        "--compression-type",
        "lz4",
        "--http-port",
        str(http_port := free_port()),
    )
    conn = connection_args(secured_kafka, kind)
    try:
        jobs = tmp_path / "jobs.jsonl"
        jobs.write_text(
            "".join(
                json.dumps({"id": f"job-{i}", "prompt": f"{i} + {i} =", "max_new_tokens": 3}) + "\n"
                for i in range(3)
            )
        )
        submitted = await tokenmill(
            "submit",
            "--file",
            str(jobs),
            "--wait",
            "--timeout",
            "120",
            "--topic",
            lane.requests,
            "--results-topic",
            lane.results,
            *conn,
        )
        assert submitted.returncode == 0, submitted.stderr[-2000:]
        answered = [json.loads(line) for line in submitted.stdout.splitlines()]
        assert sorted(r["id"] for r in answered) == ["job-0", "job-1", "job-2"]
        assert all(r["error"] is None for r in answered)

        source = tmp_path / "batch.jsonl"
        source.write_text(
            "".join(
                json.dumps(
                    {
                        "custom_id": f"line-{i}",
                        "method": "POST",
                        "url": "/v1/completions",
                        "body": {"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                    }
                )
                + "\n"
                for i in range(4)
            )
        )
        output = tmp_path / "batch.out.jsonl"
        batch = await tokenmill(
            "batch",
            "run",
            str(source),
            "-o",
            str(output),
            "--no-progress",
            "--topic",
            lane.requests,
            "--results-topic",
            lane.results,
            *conn,
        )
        assert batch.returncode == 0, batch.stderr[-2000:]
        assert len(output.read_text().splitlines()) == 4

        status = await tokenmill(
            "status",
            "--control-topic",
            control,
            "--events-topic",
            events,
            "--json",
            "--timeout",
            "30",
            *conn,
            env={"TOKENMILL_CONTROL_SECRET": SECRET},
        )
        assert status.returncode == 0, status.stderr[-2000:]
        assert '"worker"' in status.stdout

        ready = await wait_ready(worker, http_port)
        assert ready["kafka"] == "reachable"
        _, metrics = await asyncio.to_thread(http_get, http_port, "/metrics")
        password = secured_kafka.sasl_password()
        for text in (
            worker.log(),
            submitted.stderr,
            batch.stderr,
            status.stderr,
            status.stdout,
            metrics.decode(),
            json.dumps(ready),
        ):
            assert password not in text
    finally:
        assert worker.terminate() == 0, worker.log()[-3000:]


async def test_a_foreign_client_with_the_same_properties_file_is_answered(
    secured_kafka: LocalKafka, smollm2_path: Path, tmp_path: Path
) -> None:
    """librdkafka (confluent-kafka) produces a zstd-compressed job over SASL_SSL with the file
    as is; the worker answers with lz4-compressed results, which are read back."""
    lane = await new_lane(secured_kafka.bootstrap, partitions=1)
    worker = await secured_worker(
        secured_kafka, "sasl_ssl", lane, tmp_path / "worker.log", "--compression-type", "lz4"
    )
    try:
        config = read_properties(secured_kafka.client_properties("sasl_ssl"))
        producer = Producer({**config, "compression.type": "zstd"})
        job = {"id": "foreign-zstd", "prompt_token_ids": [5, 6, 7], "max_new_tokens": 4}
        producer.produce(lane.requests, key=b"foreign-zstd", value=json.dumps(job).encode())
        assert await asyncio.to_thread(producer.flush, 60) == 0
        found = await results_by_id(lane, ["foreign-zstd"], within_s=180)
        [result] = found["foreign-zstd"]
        assert result.error is None and result.token_ids == [5, 6, 7]  # the echo engine's
    finally:
        assert worker.terminate() == 0, worker.log()[-3000:]


def _wrong(kafka: LocalKafka, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each wrong setting: the connection arguments, and what its one error line must say."""
    ca = str(kafka.tls_file("ca.pem"))
    sasl = kafka.listener("sasl_ssl")
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=not-the-broker-ca",
            "-keyout",
            str(tmp_path / "other.key"),
            "-out",
            str(other_ca),
        ],
        check=True,
        capture_output=True,
    )
    wrong_password = tmp_path / "wrong.password"
    wrong_password.write_text("not-the-password\n")
    scram = [
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--ssl-ca-file",
        ca,
        "--sasl-password-file",
        str(wrong_password),
    ]
    return {
        "wrong password": (
            ["-b", sasl, *scram, "--sasl-username", "tokenmill"],
            "authentication failed for user 'tokenmill' (SCRAM-SHA-512)",
        ),
        "unknown user": (
            ["-b", sasl, *scram, "--sasl-username", "nobody"],
            "authentication failed for user 'nobody' (SCRAM-SHA-512)",
        ),
        "untrusted CA": (
            [
                "-b",
                kafka.listener("ssl"),
                "--security-protocol",
                "SSL",
                "--ssl-ca-file",
                str(other_ca),
            ],
            "certificate verify failed",
        ),
        "plaintext client on the TLS port": (
            ["-b", kafka.listener("ssl")],
            "closed the connection on the first request",
        ),
        "no client certificate on the mTLS port": (
            ["-b", kafka.listener("mtls"), "--security-protocol", "SSL", "--ssl-ca-file", ca],
            "requires a client certificate",
        ),
    }


async def test_each_wrong_setting_is_one_clear_line_and_a_quick_exit(
    secured_kafka: LocalKafka, tmp_path: Path
) -> None:
    for name, (args, says) in _wrong(secured_kafka, tmp_path).items():
        began = time.monotonic()
        done = await tokenmill("topics", "list", *args)
        took = time.monotonic() - began
        assert done.returncode != 0, name
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and says in lines[0], (name, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and secured_kafka.sasl_password() not in done.stderr
        print(f"{name}: exit {done.returncode} in {took:.1f} s: {lines[0]}")


async def test_a_worker_with_a_wrong_password_exits_with_that_reason(
    secured_kafka: LocalKafka, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(secured_kafka.bootstrap, partitions=1)
    args, says = _wrong(secured_kafka, tmp_path)["wrong password"]
    worker = WorkerProcess(
        lane, MODEL, tmp_path / "worker.log", extra=["--engine", "echo", *args]
    ).start()
    try:
        code = await asyncio.to_thread(worker.wait, 240)
    finally:
        worker.close()
    log = worker.log()
    assert code == 1, log[-3000:]
    assert says in log and "kafka_unusable" in log, log[-3000:]
    assert "child_restarted" not in log, "a setting to fix is not retried"
    assert secured_kafka.sasl_password() not in log


def unsigned_jwt(subject: str, lifetime_s: float = 3600) -> str:
    """What the broker's built-in (unsecured) OAUTHBEARER validator accepts: alg none."""

    def part(claims: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"sub": subject, "iat": now, "exp": now + int(lifetime_s)}
    return f"{part({'alg': 'none'})}.{part(claims)}."


async def test_oauthbearer_from_a_token_file_and_from_a_token_command(
    secured_kafka: LocalKafka, smollm2_path: Path, tmp_path: Path
) -> None:
    """The worker reads its token from a file; `submit` gets its own from a command."""
    lane = await new_lane(secured_kafka.bootstrap, partitions=1)
    token = tmp_path / "token.jwt"
    token.write_text(unsigned_jwt("tokenmill") + "\n")
    oauth = [
        "-b",
        secured_kafka.listener("sasl_ssl"),
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        "OAUTHBEARER",
        "--ssl-ca-file",
        str(secured_kafka.tls_file("ca.pem")),
    ]
    worker = WorkerProcess(
        lane,
        MODEL,
        tmp_path / "worker.log",
        extra=["--engine", "echo", *oauth, "--oauth-token-file", str(token)],
    ).start()
    try:
        await worker.wait_for_log("partitions_assigned", within_s=240)
        command = f"cat {token}"  # as a cloud CLI's `... get-token` would print one
        submitted = await tokenmill(
            "submit",
            "Hi",
            "--wait",
            "--timeout",
            "120",
            "--topic",
            lane.requests,
            "--results-topic",
            lane.results,
            *oauth,
            "--oauth-token-command",
            command,
        )
        assert submitted.returncode == 0, submitted.stderr[-2000:]
        [result] = [json.loads(line) for line in submitted.stdout.splitlines()]
        assert result["error"] is None
    finally:
        assert worker.terminate() == 0, worker.log()[-3000:]
