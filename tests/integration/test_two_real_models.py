"""Two real models on a real worker subprocess: Gemma 3 270M served token for token as
transformers reads the same GGUF, and a hot swap SmolLM2 (Llama, BPE) → Gemma 3 (SentencePiece
vocabulary of 262k) → SmolLM2 under a steady stream, each result tokenized for and run on the
model it names.

Gemma runs at about a token a second on a busy 2-core CPU, so requests are few and short."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from messages.events import ModelSwapped
from messages.request import GenerateRequest
from messages.result import GenerateResult
from tests.integration.pipeline import WorkerProcess, new_lane, produce, results_by_id
from tests.integration.test_hot_swap import Rig, start_rig
from tests.unit.ops.models.test_generate_cli import hf_generate

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Ünïcödé, emoji 😀 and   spaces:"]


def prompt_of(n: int) -> str:
    # Accents and an emoji: SmolLM2's byte-level BPE and Gemma's vocabulary count differently.
    return f"Ünïcödé {n}: name one colour."


def tokenizer_of(path: Path):  # type: ignore[no-untyped-def]
    from gpu.loading.gguf import read_gguf_header

    return read_gguf_header(path)[1]


def answered(found: dict[str, list[GenerateResult]], ids: list[str], log: str) -> None:
    assert set(found) >= set(ids), f"no answer to {sorted(set(ids) - set(found))}:\n{log[-3000:]}"


async def test_gemma3_worker_matches_transformers(kafka_bootstrap, tmp_path, gemma3_path) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    worker = WorkerProcess(
        lane, "gemma3-270m", tmp_path / "worker.log", ["--dtype", "float32", "--device", "cpu"]
    ).start()
    requests = [
        GenerateRequest(id=f"g{i}", prompt=p, max_new_tokens=3) for i, p in enumerate(PROMPTS)
    ]
    try:
        started = time.monotonic()
        await produce(lane.bootstrap, lane.requests, requests)
        ids = [r.id for r in requests]
        found = await results_by_id(lane, ids, within_s=600)  # returns once all are found
        elapsed = time.monotonic() - started
    finally:
        code = worker.terminate()
    answered(found, ids, worker.log())
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        str(gemma3_path.parent), gguf_file=gemma3_path.name, dtype=torch.float32
    ).eval()
    tokenizer = tokenizer_of(gemma3_path)
    for request in requests:
        (result,) = found[request.id]
        assert result.error is None, result.error
        prompt_ids = tokenizer.encode(request.prompt)  # with <bos>, as the file asks
        assert result.token_ids == hf_generate(hf, prompt_ids, 3), request.prompt
        assert result.usage.prompt_tokens == len(prompt_ids)
        assert result.model is not None and result.model.name == "gemma3-270m"
    print(f"gemma3-270m worker: {len(requests)} results {elapsed:.0f} s after producing")
    assert code == 0


async def stream(rig: Rig, stop: asyncio.Event, every_s: float) -> list[str]:
    """One 2-token request every `every_s` until `stop`; the ids sent."""
    ids: list[str] = []
    while not stop.is_set():
        n = len(ids)
        request = GenerateRequest(id=f"s{n}", prompt=prompt_of(n), max_new_tokens=2)
        rig.sent_at[request.id] = time.time()
        rig.sent.set()
        await produce(rig.lane.bootstrap, rig.lane.requests, [request])
        ids.append(request.id)
        await asyncio.sleep(every_s)
    return ids


async def answered_after(rig: Rig, at: float, n: int, within_s: float = 300.0) -> None:
    """Until `n` requests sent after `at` (wall clock, as events say) have their results."""
    async with asyncio.timeout(within_s):
        while len(later := [i for i, sent in rig.sent_at.items() if sent > at]) < n:
            rig.sent.clear()
            await rig.sent.wait()
    found = await results_by_id(rig.lane, later[:n], within_s=within_s)  # returns once found
    assert set(later[:n]) <= found.keys(), f"no answers to {later[:n]} within {within_s} s"


async def test_swap_smollm2_gemma3_smollm2_under_a_stream(
    kafka_bootstrap, tmp_path, smollm2_path, gemma3_path
) -> None:
    # Swaps resolve an alias through the registry; its file must lie in the models directory,
    # so that is the model cache itself.
    models = gemma3_path.parent.parent
    assert smollm2_path.is_relative_to(models)
    rig = await start_rig(
        kafka_bootstrap, tmp_path, Path("smollm2-135m"), models, "--dtype", "float32"
    )
    try:
        stop = asyncio.Event()
        streaming = asyncio.create_task(stream(rig, stop, 0.5))
        await rig.answered_after(0.0)  # SmolLM2 serves
        to_b = await rig.swap("gemma3-270m")
        assert isinstance(to_b, ModelSwapped), to_b
        await answered_after(rig, to_b.at, 3)  # sent after the flip: run on Gemma
        to_a = await rig.swap("smollm2-135m")
        assert isinstance(to_a, ModelSwapped), to_a
        await rig.answered_after(to_a.at, within_s=300)
        stop.set()
        ids = await streaming
        found = await results_by_id(rig.lane, ids, within_s=600)
    finally:
        code = rig.worker.terminate()
    answered(found, ids, rig.worker.log())
    a, b = to_b.from_model, to_b.to_model
    # Swapped to by alias, the model is named by its file (started by alias: by the alias).
    assert a.name == "smollm2-135m" and b.name in ("gemma3-270m", gemma3_path.stem), (a, b)
    assert a.digest != b.digest
    assert to_a.to_model == a and to_a.load_ms == 0, "SmolLM2 was still in standby: a flip"
    assert set(found) == set(ids), f"unasked results {sorted(set(found) - set(ids))[:5]}"
    assert all(len(results) == 1 for results in found.values()), "exactly once"
    results = {i: rs[0] for i, rs in found.items()}
    assert [r.error for r in results.values() if r.error is not None] == []

    tokenizers = {
        ref.digest: tokenizer_of(path) for ref, path in ((a, smollm2_path), (b, gemma3_path))
    }
    smollm2_count, gemma_count = (len(tokenizers[m.digest].encode(prompt_of(0))) for m in (a, b))
    assert smollm2_count != gemma_count, "the prompts tell the tokenizers apart"
    on: dict[str, list[str]] = {a.digest: [], b.digest: []}
    for n, request_id in enumerate(ids):
        result = results[request_id]
        assert result.model in (a, b), (request_id, result.model)
        on[result.model.digest].append(request_id)
        # Tokenized for the model that ran it, whichever that was.
        prompt_tokens = len(tokenizers[result.model.digest].encode(prompt_of(n)))
        assert result.usage.prompt_tokens == prompt_tokens, (request_id, result.model.name)
        sent = rig.sent_at[request_id]
        if sent > to_a.at:  # sent after the flip back → admitted after it
            assert result.model == a, (request_id, result.model)
    # The first three sent after the flip were answered before the swap back was sent.
    first_on_gemma = [i for i in ids if rig.sent_at[i] > to_b.at][:3]
    assert [results[i].model for i in first_on_gemma] == [b] * 3
    print(
        f"{len(ids)} requests answered once each ({len(on[a.digest])} on SmolLM2, "
        f"{len(on[b.digest])} on Gemma 3); swap to gemma3-270m load {to_b.load_ms:.0f} ms, "
        f"smoke {to_b.smoke_ms:.0f} ms, flip {to_b.flip_ms:.2f} ms; back: flip "
        f"{to_a.flip_ms:.2f} ms; Gemma's name {b.name!r}"
    )
    assert code == 0
