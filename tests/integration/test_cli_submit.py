"""`tokenmill submit --wait` against a running worker: the user's way in, end to end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from tests.integration.pipeline import REPO, new_lane, running_worker


def submit(*args: str, bootstrap: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`tokenmill submit ARGS` as a subprocess; `timeout` only bounds a hang."""
    env = {**os.environ, "TOKENMILL_BOOTSTRAP_SERVERS": bootstrap}
    return subprocess.run(
        [sys.executable, "-m", "ops", "submit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def test_submit_a_jobs_file_and_wait(kafka_bootstrap, tiny_checkpoints, tmp_path) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=2)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        '{"id": "one", "prompt_token_ids": [4, 5, 6], "max_new_tokens": 3}\n'
        '{"prompt_token_ids": [7, 8], "max_new_tokens": 2}\n'  # gets an id
        '{"id": "refused", "prompt_token_ids": [4], "max_new_tokens": 0}\n'
    )
    engine = Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())
    async with running_worker(lane.worker_config(), engine):
        done = await asyncio.to_thread(
            submit,
            "--file", str(jobs), "--wait", "--timeout", "120",
            "--topic", lane.requests, "--results-topic", lane.results,
            bootstrap=lane.bootstrap,
        )  # fmt: skip

    assert done.returncode == 1, done.stderr[-2000:] + done.stdout[-2000:]
    results = {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert len(results) == 3, done.stdout + done.stderr[-1500:]
    assert 1 <= results["one"]["usage"]["completion_tokens"] <= 3  # random weights may stop
    assert results["refused"]["error"]["code"] == "invalid_max_tokens"
    (generated_id,) = set(results) - {"one", "refused"}
    assert generated_id.startswith("job-") and results[generated_id]["error"] is None
    assert "sent 3 request(s)" in done.stderr


def test_submit_needs_a_prompt_or_a_file() -> None:
    done = submit(bootstrap="127.0.0.1:1")
    assert done.returncode == 2
    assert "give a PROMPT or --file" in done.stderr
