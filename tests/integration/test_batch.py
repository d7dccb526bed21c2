"""`tokenmill batch run|status` as a user runs them: subprocesses against real worker subprocesses
on the session broker. SmolLM2 answers the mixed file; the echo engine (no weights) drives the
long files, where the client's behaviour, not the model, is under test."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ops.bench.batch import run_measured
from tests.integration.pipeline import REPO, Lane, WorkerProcess, new_lane

MODEL = "smollm2-135m"


def batch_argv(lane: Lane, command: str, *args: str) -> list[str]:
    """`tokenmill batch COMMAND` on the lane's topics; `args` come last, so a test's own
    `--stall-timeout` beats the lane's (click keeps an option's last value)."""
    return [
        sys.executable, "-m", "ops", "batch", command,
        "--bootstrap-servers", lane.bootstrap,
        "--topic", lane.requests, "--results-topic", lane.results,
        "--stall-timeout", "120", *args,
    ]  # fmt: skip


def batch_run(lane: Lane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        batch_argv(lane, "run", *args), cwd=REPO, capture_output=True, text=True, timeout=600
    )


def batch_status(output: Path, source: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops", "batch", "status", str(output), "--input", str(source)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    """The client as a user's shell starts it: with Ctrl-C live even when this test session
    runs in the background (where the shell ignores SIGINT, and children inherit that)."""
    return subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def output_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def chat(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], **body},
    }


def completion(custom_id: str, prompt: str | list[int], **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": MODEL, "prompt": prompt, **body},
    }


def write_jsonl(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@asynccontextmanager
async def worker(lane: Lane, log: Path, *extra: str) -> AsyncIterator[WorkerProcess]:
    process = WorkerProcess(lane, MODEL, log, extra=list(extra)).start()
    try:
        await process.wait_for_log("ingest_started")
        yield process
    finally:
        process.close()


async def test_a_mixed_file_gets_one_openai_shaped_line_per_input_line(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap)
    good = [chat(f"chat-{i}", f"Name a color, number {i}.", max_tokens=4) for i in range(6)]
    good += [completion(f"text-{i}", f"{i} + {i} =", max_tokens=3) for i in range(6)]
    good += [
        chat("paris", "What is the capital of France?", max_tokens=8),
        completion("ids", [504, 3458, 282], max_tokens=2, stop="\n"),
    ]
    bad: list[dict[str, Any] | str] = [
        "{not json",
        {"method": "POST", "url": "/v1/completions", "body": {"prompt": "no id"}},
        completion("text-0", "a duplicate custom_id"),
        {**completion("embed", "x"), "url": "/v1/moderations"},
        completion("many-answers", "x", n=17),  # over the 16 choices a request may ask
        completion("too-hot", "x", temperature=-1),
        completion("other-model", "x", model="gpt-4o-mini"),  # refused by the worker
        completion("huge", "many words " * 200_000),  # over the producer's 1 MiB
        "[" * 5000,  # nested too deeply to decode
        completion("suffix", "x", suffix="!"),  # insertion: not served
        "",  # blank: not a line to answer
    ]
    source = write_jsonl(tmp_path / "in.jsonl", [*good, *bad])
    out = tmp_path / "out.jsonl"

    async with worker(lane, tmp_path / "worker.log") as process:
        done = await asyncio.to_thread(batch_run, lane, str(source), "-o", str(out), "--json")
        assert process.terminate() == 0

    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["complete"] and summary["total_lines"] == len(good) + len(bad) - 1
    lines = output_lines(out)
    assert len(lines) == summary["total_lines"]
    for line in lines:
        assert set(line) == {"id", "custom_id", "response", "error"}
        assert line["id"].startswith("batch_req_")
    by_id = {line["custom_id"]: line for line in lines if line["custom_id"] is not None}
    ids = [line["custom_id"] for line in lines if line["custom_id"] is not None]
    assert len(ids) == len(set(ids)), "a custom_id answered twice"

    for request in good:
        response = by_id[request["custom_id"]]["response"]
        assert response["status_code"] == 200 and by_id[request["custom_id"]]["error"] is None
        body = response["body"]
        assert body["model"] == MODEL and body["usage"]["completion_tokens"] >= 1
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        if request["url"] == "/v1/chat/completions":
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["role"] == "assistant"
        else:
            assert body["object"] == "text_completion"
            assert isinstance(body["choices"][0]["text"], str)
    assert "Paris" in by_id["paris"]["response"]["body"]["choices"][0]["message"]["content"]

    errors = {line["error"]["line"]: line for line in lines if line["error"] is not None}
    first_bad = len(good) + 1
    assert errors[first_bad]["error"]["code"] == "invalid_json"
    assert errors[first_bad + 1]["error"]["code"] == "missing_custom_id"
    assert errors[first_bad + 2]["error"]["code"] == "duplicate_custom_id"
    assert errors[first_bad + 2]["custom_id"] is None
    assert by_id["embed"]["error"]["code"] == "unsupported_url"
    assert by_id["many-answers"]["error"] == {
        "code": "invalid_request",
        "message": "n must be in [1, 16], got 17",
        "line": first_bad + 4,
        "param": None,
    }
    assert by_id["too-hot"]["error"]["code"] == "invalid_sampling_params"
    assert by_id["huge"]["error"]["code"] == "message_too_large"
    assert errors[first_bad + 8]["error"]["code"] == "invalid_json"
    assert by_id["suffix"]["error"]["code"] == "unsupported_parameter"
    refused = by_id["other-model"]["response"]
    assert refused["status_code"] == 404
    assert refused["body"]["error"]["code"] == "unknown_model"
    assert refused["body"]["error"]["type"] == "invalid_request_error"

    status = await asyncio.to_thread(batch_status, out, source)
    assert "0 left" in status.stdout and f"{len(lines)} of {len(lines)} answered" in status.stdout


def echo_file(path: Path, lines: int) -> Path:
    with path.open("w") as f:
        for i in range(lines):
            line = completion(f"line-{i}", [100 + i % 50, 7, 8, 9], max_tokens=2)
            f.write(json.dumps(line) + "\n")
    return path


async def test_a_run_interrupted_then_killed_resumes_without_duplicates(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap)
    total = 3000
    source = echo_file(tmp_path / "in.jsonl", total)
    out = tmp_path / "out.jsonl"
    argv = batch_argv(lane, "run", str(source), "-o", str(out), "--max-inflight", "4")

    async def stop_midway(sig: signal.Signals, after_lines: int) -> tuple[int, bytes]:
        client = start(argv)
        while not out.exists() or out.read_bytes().count(b"\n") < after_lines:
            assert client.poll() is None, client.communicate()[1][-2000:]
            await asyncio.sleep(0.02)
        client.send_signal(sig)
        _, stderr = await asyncio.to_thread(client.communicate, timeout=60)
        return client.returncode, stderr

    async with worker(lane, tmp_path / "worker.log", "--engine", "echo") as process:
        code, stderr = await stop_midway(signal.SIGINT, 300)  # Ctrl-C
        assert code == 130 and b"rerun the same command" in stderr, stderr[-2000:]
        assert b"Traceback" not in stderr
        after_interrupt = out.read_bytes().count(b"\n")
        assert out.read_bytes().endswith(b"\n")

        code, _ = await stop_midway(signal.SIGKILL, after_interrupt + 300)
        assert code == -signal.SIGKILL
        after_kill = out.read_bytes().count(b"\n")
        assert after_interrupt + 300 <= after_kill < total, "the run ended before the kill"

        done = await asyncio.to_thread(batch_run, lane, str(source), "-o", str(out), "--json")
        assert process.terminate() == 0

    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["complete"] and summary["already_answered"] == after_kill
    assert summary["answered"] == total - after_kill
    counts = Counter(line["custom_id"] for line in output_lines(out))
    assert len(counts) == total and set(counts.values()) == {1}
    assert all(line["response"]["status_code"] == 200 for line in output_lines(out))


def run_to_the_end(argv: list[str]) -> dict[str, Any]:
    """Run a `batch run --json` to its end; its summary."""
    measured = run_measured(argv, cwd=REPO)
    assert measured.returncode == 0, measured.stderr[-3000:]
    summary: dict[str, Any] = json.loads(measured.stdout)
    return summary


async def test_the_clients_memory_does_not_grow_with_the_file(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap)
    small = echo_file(tmp_path / "small.jsonl", 10_000)
    large = echo_file(tmp_path / "large.jsonl", 100_000)

    async with worker(lane, tmp_path / "worker.log", "--engine", "echo") as process:
        peaks = {}
        for source in (small, large):
            argv = batch_argv(lane, "run", str(source), "-o", str(source) + ".out", "--json")
            summary = await asyncio.to_thread(run_to_the_end, argv)
            assert summary["complete"] and summary["ok"] == summary["total_lines"]
            peaks[source.name] = summary["peak_rss_mb"]
        assert process.terminate() == 0

    print(f"batch client peak RSS (MB): {peaks}")
    assert peaks["large.jsonl"] < 300, peaks
    assert peaks["large.jsonl"] - peaks["small.jsonl"] < 20, peaks


async def test_with_no_worker_the_run_stops_at_the_stall_timeout_and_resumes_later(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap)
    source = echo_file(tmp_path / "in.jsonl", 20)
    out = tmp_path / "out.jsonl"

    stalled = await asyncio.to_thread(
        batch_run, lane, str(source), "-o", str(out), "--json", "--stall-timeout", "2"
    )
    assert stalled.returncode == 1, stalled.stderr[-2000:]
    summary = json.loads(stalled.stdout)
    assert summary["stalled"] and not summary["complete"]
    assert summary["in_flight_at_end"] == 20 and out.read_bytes() == b""
    assert "rerun to resume" in stalled.stderr

    # The worker also answers the first run's 20 requests; this run ignores those results.
    async with worker(lane, tmp_path / "worker.log", "--engine", "echo") as process:
        done = await asyncio.to_thread(batch_run, lane, str(source), "-o", str(out), "--json")
        assert process.terminate() == 0
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["answered"] == 20
    assert sorted(line["custom_id"] for line in output_lines(out)) == sorted(
        f"line-{i}" for i in range(20)
    )


async def test_an_unreachable_broker_is_a_one_line_error(tmp_path: Path) -> None:
    source = echo_file(tmp_path / "in.jsonl", 3)
    argv = [
        sys.executable, "-m", "ops", "batch", "run", str(source), "-o", str(tmp_path / "out"),
        "--bootstrap-servers", "127.0.0.1:1",
    ]  # fmt: skip
    done = await asyncio.to_thread(run_measured, argv, REPO)
    assert done.returncode == 1
    assert "cannot reach Kafka at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr
