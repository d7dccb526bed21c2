"""A configuration that could make a result too large to send is refused before it serves:
at start (the worker, the CLI) and at a swap to a model with longer tokens or outputs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from actors.config import WorkerConfig
from actors.gpu_actor import GpuActor
from actors.ingest.model_front import ModelFront, result_size_refusal
from actors.mail import SwapOrder
from actors.swap.swapper import Swapper, SwapSettings, engine_builder_like
from actors.worker import Worker
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.events import ModelSwapFailed, ModelSwapStarted
from ops.cli import cli
from tests.unit.actors.swap.test_swapper import Inbox


@pytest.fixture(scope="module")
def engine(tiny_checkpoints: dict[str, Path]) -> Engine:
    return Engine(load_model(tiny_checkpoints["llama"], name="tiny"), EngineConfig())


def test_the_bound_counts_the_models_longest_token(engine: Engine) -> None:
    front = ModelFront.of_engine(engine)
    assert front.max_token_bytes == max(
        len(engine.model.tokenizer.decode([i], skip_special_tokens=False).encode())
        for i in range(engine.model.config.vocab_size)
    )
    assert result_size_refusal(front, front.result_size_bound) is None
    refusal = result_size_refusal(front, front.result_size_bound - 1)
    assert refusal is not None
    assert "--max-message-bytes" in refusal and "--max-new-tokens-limit" in refusal


def test_a_worker_that_could_make_an_unsendable_result_does_not_start(engine: Engine) -> None:
    front = ModelFront.of_engine(engine)
    small = WorkerConfig(max_request_bytes=1024, max_message_bytes=front.result_size_bound - 1)
    with pytest.raises(ValueError, match="can produce results of up to"):
        Worker(small, engine, front)
    Worker(WorkerConfig(), engine, front)  # the defaults fit


def test_the_cli_refuses_such_a_worker_with_one_clear_line(tiny_checkpoints) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "worker", "--model", str(tiny_checkpoints["llama"]), "--http-port", "-1",
            "--max-request-bytes", "1024", "--max-message-bytes", "140000",
            "--max-new-tokens-limit", "4096", "--bootstrap-servers", "127.0.0.1:1",
        ],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "over max_message_bytes 140000" in result.output
    assert "Traceback" not in result.output


async def test_a_swap_to_a_model_whose_results_could_not_be_sent_is_refused(
    tiny_checkpoints, engine: Engine
) -> None:
    events = Inbox()
    # The producer's limit is one byte under what the candidate's results could take.
    candidate = ModelFront.of_engine(
        Engine(load_model(tiny_checkpoints["gpt2"], name="gpt2"), EngineConfig())
    )
    limit = candidate.result_size_bound - 1
    swapper = Swapper(engine_builder_like(engine), SwapSettings(max_result_bytes=limit))
    gpu = GpuActor(engine, Inbox(), "w1", events=events, swapper=swapper)
    task = asyncio.create_task(gpu.run())
    try:
        await gpu.send(SwapOrder(target=tiny_checkpoints["gpt2"], requested="gpt2"))
        started, failed = await events.take(2)
        assert isinstance(started, ModelSwapStarted)
        assert (
            isinstance(failed, ModelSwapFailed) and "can produce results of up to" in failed.reason
        )
        assert gpu.engine.model.digest == engine.model.digest
    finally:
        gpu.stop()
        await task
