"""`tokenmill status | swap | drain` against a real broker and an in-process control actor.

A stand-in supervisor answers each command the way the worker's does, naming the command.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

from actors.mail import VerifiedCommand
from messages.control import Drain, Status, SwapModel
from messages.events import (
    Event,
    ModelSwapFailed,
    ModelSwapped,
    ModelSwapStarted,
    StatusReply,
    WorkerDraining,
    WorkerStopped,
)
from messages.result import ModelRef
from tests.integration.control_lane import Answering, ControlLane, new_control_lane, running_control
from tests.integration.pipeline import REPO

TINY = ModelRef(name="tiny", digest="sha256:" + "ab" * 32)
NEXT = ModelRef(name="next", digest="sha256:" + "cd" * 32)


async def tokenmill(
    lane: ControlLane, *args: str, secret: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (the control actor runs in this one)."""
    env = {
        **os.environ,
        "TOKENMILL_CONTROL_SECRET": secret or lane.secret,
        "COLUMNS": "250",  # the status table on one line per worker
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops", *args, *lane.cli_args(),
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(180):
        out, err = await process.communicate()
    assert process.returncode is not None
    return subprocess.CompletedProcess(args, process.returncode, out.decode(), err.decode())


def answers(worker: str) -> Callable[[VerifiedCommand], list[Event]]:
    def answer(verified: VerifiedCommand) -> list[Event]:
        common = {"worker": worker, "at": time.time(), "command": verified.nonce}
        match verified.command:
            case Status():
                return [
                    StatusReply(
                        **common, model=TINY, standby=NEXT, uptime_s=3725.0, queued=3,
                        running=7, kv_blocks_used=12, kv_blocks_total=100, restarts=1,
                    )
                ]  # fmt: skip
            case SwapModel(model="next"):
                return [
                    ModelSwapStarted(**common, from_model=TINY, to_model="next"),
                    ModelSwapped(
                        **common, from_model=TINY, to_model=NEXT, load_ms=812.4,
                        smoke_ms=40.2, flip_ms=0.3, drained=True, pause_ms=120.0,
                    ),
                ]  # fmt: skip
            case SwapModel(model="slow"):
                return [ModelSwapStarted(**common, from_model=TINY, to_model="slow")]
            case SwapModel(model=model):
                return [ModelSwapFailed(**common, to_model=model, reason="unknown model")]
            case Drain():
                return [
                    WorkerDraining(**common, reason="drain command", in_flight=2),
                    WorkerStopped(**common, answered=2, failed_on_shutdown=0),
                ]
        return []

    return answer


async def test_status_with_no_worker_fails_clearly(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    done = await tokenmill(lane, "status", "--timeout", "1")
    assert done.returncode == 1, done.stderr
    assert f"no worker answered within 1 s on {lane.control}" in done.stderr


async def test_status_prints_a_row_per_worker(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()
    async with running_control(config, Answering(answers(config.worker_id))):
        table = await tokenmill(lane, "status", "--timeout", "2")
        as_json = await tokenmill(lane, "status", "--timeout", "2", "--json")
    assert table.returncode == 0, table.stderr
    for cell in (config.worker_id, "tiny", "sha256:abababababab", "next@sha256:cdcdcdcdcdcd",
                 "1h02m", "12/100 (12%)"):  # fmt: skip
        assert cell in table.stdout, cell
    assert as_json.returncode == 0, as_json.stderr
    (row,) = map(json.loads, as_json.stdout.splitlines())
    assert (row["type"], row["worker"], row["queued"], row["running"]) == (
        "status_reply", config.worker_id, 3, 7,
    )  # fmt: skip


async def test_swap_wait_prints_each_worker_and_its_times(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()
    async with running_control(config, Answering(answers(config.worker_id))):
        started = time.monotonic()
        done = await tokenmill(lane, "swap", "--model", "next", "--wait", "--timeout", "60")
        took = time.monotonic() - started
        failed = await tokenmill(lane, "swap", "--model", "nope", "--wait", "--timeout", "60")
        quick = await tokenmill(lane, "swap", "--model", "next")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"{config.worker_id}  swapped  tiny@sha256:abababababab → next@sha256:cdcdcdcdcdcd  "
        "load 812 ms, smoke 40 ms, flip 0 ms, drained first (paused 120 ms)"
    )
    assert took < 30, "--wait returns once every worker that answered has finished"
    assert failed.returncode == 1
    assert f"{config.worker_id}  failed  → nope: unknown model" in failed.stdout
    assert quick.returncode == 0, quick.stderr
    assert f"{config.worker_id}  swapping  tiny@sha256:abababababab → next" in quick.stdout


async def test_swap_wait_names_a_worker_that_did_not_finish(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()
    async with running_control(config, Answering(answers(config.worker_id))):
        done = await tokenmill(lane, "swap", "--model", "slow", "--wait", "--timeout", "3")
    assert done.returncode == 1
    assert done.stdout.strip() == (
        f"{config.worker_id}  unfinished after 3 s "
        "(last: swapping  tiny@sha256:abababababab → slow)"
    )


async def test_a_refused_command_exits_1_and_says_why(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()
    async with running_control(config, Answering(answers(config.worker_id))):
        done = await tokenmill(lane, "rollback", "--wait", "--timeout", "60", secret="wrong")
    assert done.returncode == 1
    assert f"{config.worker_id}  refused  bad_signature:" in done.stdout


async def test_drain_wait_reports_the_worker_stopped(kafka_bootstrap: str) -> None:
    lane = await new_control_lane(kafka_bootstrap)
    config = lane.worker_config()
    async with running_control(config, Answering(answers(config.worker_id))):
        done = await tokenmill(lane, "drain", "--yes", "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{config.worker_id}  draining  2 in flight (drain command)",
        f"{config.worker_id}  stopped  answered 2, failed 0",
    ]
