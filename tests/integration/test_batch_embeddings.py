"""`tokenmill batch run` and `tokenmill submit --embed` as a user runs them, against a real
worker subprocess serving EmbeddingGemma-300M on the session broker: an OpenAI Batch file of
`/v1/embeddings` lines gets one OpenAI-shaped answer per line (a rerun answers nothing twice),
and a jobs file of embedding requests one result per id.

EmbeddingGemma runs a few texts a second on a busy 2-core CPU: texts are few and short."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from messages.openai_batch import EMBEDDINGS_URL
from tests.integration.pipeline import REPO, Lane, WorkerProcess, new_lane
from tests.integration.test_batch import batch_run, output_lines, write_jsonl

pytestmark = pytest.mark.slow

WIDTH = 768


@pytest.fixture(scope="module")
def embedding_worker(
    kafka_bootstrap: str, embeddinggemma_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Lane, WorkerProcess]]:
    """One worker serving EmbeddingGemma-300M on topics of its own."""
    lane = asyncio.run(new_lane(kafka_bootstrap))
    log = tmp_path_factory.mktemp("batch-embeddings") / "worker.log"
    process = WorkerProcess(lane, "embeddinggemma-300m", log).start()
    try:
        asyncio.run(process.wait_for_log("ingest_started", within_s=300))
        yield lane, process
    finally:
        process.close()


def line(custom_id: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": EMBEDDINGS_URL, "body": body}


def test_a_file_of_embeddings_lines_gets_one_answer_per_line(
    embedding_worker: tuple[Lane, WorkerProcess], tmp_path: Path
) -> None:
    lane, worker = embedding_worker
    good = [line(f"doc-{n}", input=f"Document {n} is about Kafka.") for n in range(8)]
    good += [
        line("pair", input=["a query", "a document"], dimensions=256),
        line("query", input="capital of France", prompt_name="query", encoding_format="base64"),
        line("long", input="word " * 3000, truncate=True),  # over 2048 tokens: cut at the end
        line("ids", input=[[2, 9259, 1], [2, 1]]),
    ]
    bad = [
        line("empty", input=""),
        line("unknown", input="x", normalize=True),  # a file refuses unknown fields
        line("too-long", input="word " * 3000),  # no truncation asked: refused by the worker
        line("doc-0", input="a duplicate custom_id"),
        {
            "custom_id": "chat",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        },
    ]
    source = write_jsonl(tmp_path / "in.jsonl", [*good, *bad])
    out = tmp_path / "out.jsonl"

    done = batch_run(lane, str(source), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr[-3000:] + worker.log()[-3000:]
    summary = json.loads(done.stdout)
    assert summary["complete"] and summary["total_lines"] == len(good) + len(bad)
    assert summary["embeddings"] == 8 + 2 + 1 + 1 + 2
    lines = output_lines(out)
    assert len(lines) == summary["total_lines"]
    ids = Counter(x["custom_id"] for x in lines)
    assert ids[None] == 1 and all(n == 1 for k, n in ids.items() if k is not None)
    by_id = {x["custom_id"]: x for x in lines if x["custom_id"] is not None}

    for custom_id in [f"doc-{n}" for n in range(8)] + ["long"]:
        response = by_id[custom_id]["response"]
        assert response["status_code"] == 200, by_id[custom_id]
        body = response["body"]
        assert set(body) == {"object", "data", "model", "usage"} and body["object"] == "list"
        [vector] = body["data"]
        assert (vector["object"], vector["index"], len(vector["embedding"])) == (
            "embedding", 0, WIDTH,
        )  # fmt: skip
        assert abs(np.linalg.norm(vector["embedding"]) - 1) < 1e-4
    assert by_id["long"]["response"]["body"]["usage"]["prompt_tokens"] <= 2048
    pair = by_id["pair"]["response"]["body"]["data"]
    assert [(d["index"], len(d["embedding"])) for d in pair] == [(0, 256), (1, 256)]
    assert isinstance(by_id["query"]["response"]["body"]["data"][0]["embedding"], str)
    assert [len(d["embedding"]) for d in by_id["ids"]["response"]["body"]["data"]] == [WIDTH] * 2

    assert (by_id["empty"]["response"], by_id["empty"]["error"]["code"]) == (None, "empty_prompt")
    assert by_id["unknown"]["error"]["param"] == "normalize"
    too_long = by_id["too-long"]["response"]
    assert (too_long["status_code"], too_long["body"]["error"]["code"]) == (400, "prompt_too_long")
    chat = by_id["chat"]["response"]  # a generation sent to the embedding worker
    assert (chat["status_code"], chat["body"]["error"]["code"]) == (400, "unsupported_task")

    again = batch_run(lane, str(source), "-o", str(out), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["already_answered"] == len(lines)
    assert len(output_lines(out)) == len(lines)  # nothing answered twice


def test_submit_embed_sends_a_text_and_a_jobs_file_as_embed_requests(
    embedding_worker: tuple[Lane, WorkerProcess], tmp_path: Path
) -> None:
    lane, _ = embedding_worker
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        "".join(
            json.dumps(job) + "\n"
            for job in [
                {"id": "j1", "input": "one text"},
                {"id": "j2", "input": ["two", "texts"], "dimensions": 128},
                {"id": "j3", "input": "a query", "prompt_name": "query"},
                {"input": "no id given"},
            ]
        )
    )
    base = [sys.executable, "-m", "ops", "submit", "--bootstrap-servers", lane.bootstrap,
            "--topic", lane.requests, "--results-topic", lane.results, "--wait"]  # fmt: skip
    from_file = subprocess.run(
        [*base, "--file", str(jobs)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert from_file.returncode == 0, from_file.stderr[-3000:]
    results = [json.loads(x) for x in from_file.stdout.splitlines()]
    assert len(results) == 4 and len({r["id"] for r in results}) == 4  # each id once
    by_id = {r["id"]: r for r in results}
    assert [len(d["embedding"]) for d in by_id["j2"]["data"]] == [128, 128]
    assert all(r["error"] is None and r["model"]["task"] == "embed" for r in results)

    text = subprocess.run(
        [*base, "--embed", "Kafka", "--dimensions", "64", "--encoding-format", "base64"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr[-3000:]
    [result] = [json.loads(x) for x in text.stdout.splitlines()]
    assert result["dimensions"] == 64 and isinstance(result["data"][0]["embedding"], str)
