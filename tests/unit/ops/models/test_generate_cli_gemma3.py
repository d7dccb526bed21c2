"""`tokenmill generate` on the real Gemma 3 270M GGUF vs transformers reading the same file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.ops.models.test_generate_cli import hf_generate, run_generate

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    "Ünïcödé, emoji 😀 and   spaces:",
    # Over the 512-token sliding window: the local layers must drop the oldest positions.
    "Message queues decouple producers from consumers, and a worker pool drains them. " * 48
    + "In one sentence, the point of a message queue is",
]


@pytest.mark.slow
def test_gemma3_generate_matches_transformers_token_for_token(
    gemma3_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    from gpu.loading.gguf import read_gguf_header

    lines = run_generate(
        ["--model", "gemma3-270m", "--dtype", "float32", "--device", "cpu",
         *[arg for p in PROMPTS for arg in ("-p", p)],
         "--max-new-tokens", "24", "--max-batched-tokens", "256"]
    )  # fmt: skip
    assert [line["prompt"] for line in lines] == PROMPTS
    assert len(read_gguf_header(gemma3_path)[1].encode(PROMPTS[-1])) > 512

    tokenizer = read_gguf_header(gemma3_path)[1]
    hf = AutoModelForCausalLM.from_pretrained(
        str(gemma3_path.parent), gguf_file=gemma3_path.name, dtype=torch.float32
    ).eval()
    for line in lines:
        ids = tokenizer.encode(line["prompt"])  # with <bos>, as the file asks
        assert line["token_ids"] == hf_generate(hf, ids, 24), line["prompt"]
        assert line["text"] == tokenizer.decode(line["token_ids"])
        assert line["finish_reason"] in ("stop", "length")
