"""`tokenmill generate` end to end: the real SmolLM2 and tiny checkpoints vs transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ops.cli import cli

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about message queues.",
    "List three prime numbers greater than 10.",
    "Explain what a KV cache stores, in detail, for a reader who knows what attention is but "
    "has never looked inside an inference server. " * 3,
    "Hi",
    "Translate 'good morning' into Spanish and into German, then say which is longer.",
]


def run_generate(args: list[str]) -> list[dict]:  # type: ignore[type-arg]
    result = CliRunner().invoke(cli, ["generate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def hf_generate(hf, ids: list[int], n: int) -> list[int]:  # type: ignore[no-untyped-def]
    out = hf.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
    )
    return [int(t) for t in out[0, len(ids) :]]


@pytest.mark.slow
def test_smollm2_generate_matches_transformers_token_for_token(
    smollm2_path: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from gpu.loading.gguf import load_gguf

    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS))
    lines = run_generate(
        ["--model", "smollm2-135m", "--prompt-file", str(prompt_file), "--chat",
         "--max-new-tokens", "24", "--max-batched-tokens", "64"]
    )  # fmt: skip
    assert [line["prompt"] for line in lines] == PROMPTS

    tokenizer = load_gguf(smollm2_path).tokenizer
    hf = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()
    for line in lines:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": line["prompt"]}])
        ids = tokenizer.encode(chat, add_special_tokens=False)
        assert line["token_ids"] == hf_generate(hf, ids, 24), line["prompt"]
        assert line["text"] == tokenizer.decode(line["token_ids"])
        assert line["finish_reason"] in ("stop", "length")


def test_generate_on_a_tiny_checkpoint_prints_one_json_line_per_prompt(
    tiny_checkpoints: dict[str, Path],
) -> None:
    lines = run_generate(
        ["--model", str(tiny_checkpoints["gpt2"]), "-p", "The quick brown fox", "-p", "1234",
         "--max-new-tokens", "5", "--ignore-eos"]
    )  # fmt: skip
    assert [line["prompt"] for line in lines] == ["The quick brown fox", "1234"]
    assert all(len(line["token_ids"]) == 5 and line["finish_reason"] == "length" for line in lines)


def test_generate_reports_bad_input_without_a_traceback(tiny_checkpoints: dict[str, Path]) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli, ["generate", "--model", "/nonexistent/model", "-p", "x"])
    assert missing.exit_code != 0 and "Traceback" not in missing.output
    no_prompt = runner.invoke(cli, ["generate", "--model", str(tiny_checkpoints["llama"])])
    assert no_prompt.exit_code == 2 and "--prompt" in no_prompt.output
    too_long = runner.invoke(
        cli,
        ["generate", "--model", str(tiny_checkpoints["llama"]), "-p", "x", "--max-new-tokens",
         "100000"],
    )  # fmt: skip
    assert too_long.exit_code == 1 and "max_tokens_too_large" in too_long.output


@pytest.mark.parametrize(
    ("args", "exit_code", "fragment"),
    [
        (["--prompt-file", "/nonexistent/prompts.txt"], 2, "does not exist"),
        (["-p", "x", "--device", "tpu"], 1, "unknown device"),
        (["-p", "x", "--max-num-seqs", "0"], 2, "max_num_seqs must be positive"),
        (["-p", "x", "--dtype", "int3"], 1, "unknown dtype"),
        (["-p", "x", "--stop", ""], 1, "non-empty strings"),
    ],
)
def test_bad_options_get_a_clear_message(
    tiny_checkpoints: dict[str, Path], args: list[str], exit_code: int, fragment: str
) -> None:
    result = CliRunner().invoke(cli, ["generate", "--model", str(tiny_checkpoints["llama"]), *args])
    assert result.exit_code == exit_code, result.output
    assert fragment in result.output and "Traceback" not in result.output
