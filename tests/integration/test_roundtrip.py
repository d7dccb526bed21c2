"""200 mixed requests through a real broker and the real SmolLM2 → the same tokens as
`tokenmill generate` gives for the same prompts on the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.request import ChatMessage, GenerateRequest
from ops.cli import cli
from tests.integration.pipeline import new_lane, produce, results_by_id, running_worker

pytestmark = pytest.mark.slow

SUBJECTS = ["Kafka", "a cat", "the moon", "batching", "Paris", "rain", "a robot", "tea",
            "prime numbers", "the sea"]  # fmt: skip
FORMS = ["Tell me about {}.", "Write one line about {}.", "What is {}?", "Describe {} briefly.",
         "Why does {} matter?", "Name a fact about {}.", "A question about {}:",
         "Three words for {}:", "{} is", "Summarize {}."]  # fmt: skip
MAX_NEW = 8


def expected_tokens(model: Path, prompts: list[str], chat: bool, tmp: Path) -> list[list[int]]:
    """What `tokenmill generate --json` prints for these prompts."""
    prompt_file = tmp / ("chat.txt" if chat else "plain.txt")
    prompt_file.write_text("\n".join(prompts) + "\n")
    args = ["generate", "--model", str(model), "--prompt-file", str(prompt_file), "--json",
            "--max-new-tokens", str(MAX_NEW), *(["--chat"] if chat else [])]  # fmt: skip
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [line["prompt"] for line in lines] == prompts
    return [line["token_ids"] for line in lines]


async def test_round_trip_matches_generate(kafka_bootstrap, smollm2_path, tmp_path) -> None:
    prompts = [form.format(subject) for form in FORMS for subject in SUBJECTS]  # 100
    requests = [
        GenerateRequest(id=f"plain-{i}", prompt=p, max_new_tokens=MAX_NEW)
        for i, p in enumerate(prompts)
    ] + [
        GenerateRequest(
            id=f"chat-{i}",
            messages=[ChatMessage(role="user", content=p)],
            max_new_tokens=MAX_NEW,
        )
        for i, p in enumerate(prompts)
    ]
    lane = await new_lane(kafka_bootstrap, partitions=4)
    await produce(lane.bootstrap, lane.requests, requests)

    engine = Engine(load_model(smollm2_path, name="smollm2-135m"), EngineConfig())
    async with running_worker(lane.worker_config(), engine):
        found = await results_by_id(lane, [r.id for r in requests], within_s=600)

    assert len(found) == 200
    plain = expected_tokens(smollm2_path, prompts, chat=False, tmp=tmp_path)
    chat = expected_tokens(smollm2_path, prompts, chat=True, tmp=tmp_path)
    for i in range(len(prompts)):
        for kind, tokens in (("plain", plain[i]), ("chat", chat[i])):
            (result,) = found[f"{kind}-{i}"]
            assert result.error is None
            assert result.token_ids == tokens, (kind, prompts[i])
            assert result.model is not None and result.model.digest == engine.model.digest
            assert result.usage.completion_tokens == len(tokens)
