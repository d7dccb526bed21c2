"""A worker serving SmolLM2 with its GGUF blocks kept quantized (`--quantization auto`): every
result and `/metrics` name the quantization with the model, and the text is the model's."""

from __future__ import annotations

import asyncio

import pytest

from messages.request import GenerateRequest
from ops.services.local_process import free_port
from tests.integration.pipeline import WorkerProcess, new_lane, produce, results_by_id
from tests.integration.test_supervision import samples, wait_ready

pytestmark = pytest.mark.slow


async def test_results_and_metrics_name_the_quantization(
    kafka_bootstrap, tmp_path, smollm2_path
) -> None:
    lane = await new_lane(kafka_bootstrap, partitions=1)
    port = free_port()
    extra = ["--quantization", "auto", "--http-port", str(port), "--max-model-len", "512"]
    worker = WorkerProcess(lane, str(smollm2_path), tmp_path / "worker.log", extra).start()
    requests = [
        GenerateRequest(id=f"q{i}", prompt=p, max_new_tokens=8)
        for i, p in enumerate(["The capital of France is", "Two plus two is"])
    ]
    try:
        await wait_ready(worker, port, within_s=300)
        await produce(lane.bootstrap, lane.requests, requests)
        found = await results_by_id(lane, [r.id for r in requests], within_s=300)
        info = {
            labels: value
            for (name, labels), value in (await asyncio.to_thread(samples, port)).items()
            if name == "tokenmill_model_info"
        }
    finally:
        code = worker.terminate()
    for request in requests:
        (result,) = found[request.id]
        assert result.error is None, result.error
        assert result.model is not None
        assert result.model.quantization == "int4-g32+int8-g32"  # Q4_1 layers, a Q8_0 table
        assert len(result.token_ids) == 8 and result.text.strip()
    (labels,) = info
    assert ("quantization", "int4-g32+int8-g32") in labels and ("slot", "active") in labels
    assert code == 0, worker.log()[-3000:]
