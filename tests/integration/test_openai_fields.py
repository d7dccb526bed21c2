"""OpenAI request fields through the whole path: a batch file whose lines use them, run with
`tokenmill batch run` on the session broker against a SmolLM2 worker subprocess, answered as
the engine answers the same lines directly (same mapping, same result building)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.generate.answers import Answers
from actors.in_flight import InFlight, engine_request
from actors.ingest.model_front import ModelFront
from actors.mail import Admitted, Outcome, RecordRef
from actors.runtime import Mailbox
from actors.telemetry.trace_context import TraceContext
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.codec import JSON
from messages.openai_batch_answers import answer_line
from messages.openai_batch_mapping import parse_line, to_request
from ops.models.offline import run_all
from tests.integration.pipeline import new_lane
from tests.integration.test_batch import (
    batch_run,
    chat,
    completion,
    output_lines,
    worker,
    write_jsonl,
)

pytestmark = pytest.mark.slow

COUNTING = "1, 2, 3, 1, 2, 3, 1, 2, 3,"
LINES: list[dict[str, Any]] = [
    completion("plain", "The capital of France is", max_tokens=6),
    completion("n-seeded", "Once upon a time", max_tokens=8, n=3, temperature=0.9, seed=5),
    chat("n-greedy", "Name a fruit.", max_tokens=5, n=2),
    completion("n-best-of", "1, 2, 3,", max_tokens=4, n=2, best_of=2, temperature=0.7, seed=1),
    completion("logprobs", "The capital of France is", max_tokens=6, logprobs=5),
    chat("chat-logprobs", "Name a fruit.", max_tokens=5, logprobs=True, top_logprobs=3),
    completion("logprobs-hot", "Once upon", max_tokens=6, temperature=1.5, seed=3, logprobs=0),
    completion("repeat-plain", COUNTING, max_tokens=12),
    completion(
        "repeat-penalized",
        COUNTING,
        max_tokens=12,
        repetition_penalty=1.5,
        presence_penalty=1.0,
        frequency_penalty=0.5,
    ),
    chat("biased", "Count: 1, 2, 3,", max_tokens=8, min_tokens=8, logit_bias={"28": -100}),  # ","
    completion("min-p", "Once upon a time", max_tokens=8, temperature=1.0, seed=11, min_p=0.2),
    # Prompt logprobs: a text scored (perplexity), and vLLM's field beside a completion.
    completion("echo-score", "The capital of France is", max_tokens=0, echo=True, logprobs=3),
    completion("prompt-logprobs", "The capital of France is", max_tokens=3, prompt_logprobs=2),
]


def direct_bodies(smollm2_path: Path, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Each line's response body as the engine gives it run alone, through the worker's own
    request mapping (`engine_request`) and result building (`Answers`)."""
    engine = Engine(load_model(smollm2_path), EngineConfig())
    front = ModelFront.of_engine(engine)
    outcomes: Mailbox[Any] = Mailbox(len(lines) + 1)
    answers = Answers(outcomes, None, "direct")  # type: ignore[arg-type]  # names no model
    bodies = {}
    for offset, raw in enumerate(lines):
        line = parse_line(json.dumps(raw).encode())
        request = to_request(line, f"direct-{offset}", model=front.name)  # the file's alias
        prompt = front.prompt_tokens(request)
        item = Admitted(
            request=request,
            record=RecordRef("direct", 0, offset, 0),
            prompt_token_ids=prompt,
            reply_topic="direct",
            content_type=JSON,
            trace=TraceContext(),
            consumed_at=time.monotonic(),
            deadline=None,
        )
        [done] = run_all(engine, [engine_request(item, prompt)]).completions
        entry = InFlight(item, engine, model=front.ref, admitted_at=time.monotonic())
        asyncio.run(answers.finished(entry, done))
        outcome = outcomes.get_nowait()
        assert isinstance(outcome, Outcome)
        body = answer_line(line.custom_id, line.url, outcome.result).response
        assert body is not None
        bodies[line.custom_id] = msgspec.to_builtins(body.body)
    return bodies


def close(a: Any, b: Any) -> bool:
    """`a == b`, but floats (logprobs) within 1e-4: a request computed beside others can
    differ from one run alone in the last bits of its logits."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


async def test_a_batch_file_with_the_openai_fields_is_answered_as_the_engine_answers_it(
    kafka_bootstrap: str, smollm2_path: Path, tmp_path: Path
) -> None:
    lane = await new_lane(kafka_bootstrap)
    source = write_jsonl(tmp_path / "in.jsonl", list(LINES))
    out = tmp_path / "out.jsonl"
    async with worker(lane, tmp_path / "worker.log") as process:
        done = await asyncio.to_thread(batch_run, lane, str(source), "-o", str(out), "--json")
        assert process.terminate() == 0
    assert done.returncode == 0, done.stderr[-3000:]
    served = {line["custom_id"]: line for line in output_lines(out)}
    assert set(served) == {line["custom_id"] for line in LINES}
    for line in served.values():
        assert line["error"] is None and line["response"]["status_code"] == 200, line

    direct = await asyncio.to_thread(direct_bodies, smollm2_path, LINES)
    for custom_id, line in served.items():
        body = line["response"]["body"]
        assert close(body["choices"], direct[custom_id]["choices"]), custom_id
        assert body["usage"]["completion_tokens"] == direct[custom_id]["usage"]["completion_tokens"]

    # n: every choice answered, seeded samples apart from each other, greedy ones alike.
    seeded = served["n-seeded"]["response"]["body"]["choices"]
    assert [c["index"] for c in seeded] == [0, 1, 2] and len({c["text"] for c in seeded}) > 1
    greedy = served["n-greedy"]["response"]["body"]["choices"]
    assert len(greedy) == 2 and greedy[0]["message"] == greedy[1]["message"]

    # Logprobs: one entry per token in OpenAI's shapes (the values are the direct run's above).
    scored_body = served["logprobs"]["response"]["body"]
    [scored] = scored_body["choices"]
    assert len(scored["logprobs"]["tokens"]) == scored_body["usage"]["completion_tokens"]
    assert all(len(top) in (5, 6) for top in scored["logprobs"]["top_logprobs"])
    assert "".join(scored["logprobs"]["tokens"]).startswith(scored["text"])
    [chatted] = served["chat-logprobs"]["response"]["body"]["choices"]
    assert all(len(c["top_logprobs"]) == 3 for c in chatted["logprobs"]["content"])
    [hot] = served["logprobs-hot"]["response"]["body"]["choices"]
    assert all(len(top) == 1 for top in hot["logprobs"]["top_logprobs"])  # the chosen token

    # Penalties and biases: they change the answer (and the engine's direct answer agrees).
    def text(custom_id: str) -> str:
        return str(served[custom_id]["response"]["body"]["choices"][0]["text"])

    assert text("repeat-penalized") != text("repeat-plain")
    biased = served["biased"]["response"]["body"]
    assert biased["usage"]["completion_tokens"] == 8  # min_tokens: no EOS before 8
    assert "," not in biased["choices"][0]["message"]["content"]

    # Prompt logprobs: echo with max_tokens 0 is the prompt alone, its first token null.
    echoed_body = served["echo-score"]["response"]["body"]
    [echoed] = echoed_body["choices"]
    assert echoed["text"] == "The capital of France is"
    assert echoed_body["usage"]["completion_tokens"] == 0
    prompt_tokens = echoed_body["usage"]["prompt_tokens"]
    assert len(echoed["logprobs"]["tokens"]) == prompt_tokens
    assert echoed["logprobs"]["token_logprobs"][0] is None
    assert echoed["logprobs"]["top_logprobs"][0] is None
    assert all(v is not None and v <= 0 for v in echoed["logprobs"]["token_logprobs"][1:])
    [vllm] = served["prompt-logprobs"]["response"]["body"]["choices"]
    assert vllm["prompt_logprobs"][0] is None and len(vllm["prompt_logprobs"]) == prompt_tokens
    assert all(2 <= len(entry) <= 3 for entry in vllm["prompt_logprobs"][1:])
    assert not vllm["text"].startswith("The capital")  # no echo
