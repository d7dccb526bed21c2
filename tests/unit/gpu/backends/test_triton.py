"""The engine on Triton's kernels, end to end: every step's norms, rotary + K/V writes,
SwiGLU and attention (decode from the pool, prefill chunks over cached context) through
`TritonKernels`, here on the CPU under Triton's interpreter (on CUDA it is the default path).
Its tokens must equal the engine's PyTorch path, itself checked against transformers, both
with decodes through the static (graph) path and without.

TRITON_INTERPRET=1 must be set before triton is first imported (see quant/test_triton_linear), so
the Triton engine runs in one child process; the comparison happens here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpu.engine import Engine, EngineRequest
from gpu.loading.loader import load_model
from gpu.sequence import SamplingParams
from ops.models.offline import run_all
from tests.unit.gpu.test_engine import random_prompts

pytest.importorskip("triton", reason="triton is not importable", exc_type=ImportError)

ROOT = Path(__file__).resolve().parents[4]
# llama: the fused layers; qwen3: q/k norms before the fused rotary; gemma2: soft-capped
# scores and a window; gemma3: q/k norms, local and global layers (attention kernels only).
ARCHS = ("llama", "qwen3", "gemma2", "gemma3")
# decode_graphs: dynamic steps, and the static path run eagerly; then with speculation on
# (verify chunks: prefill attention over cached context, several sampled rows each).
MODES = ("off", "eager", "eager+ngram")
# Block size 4 and chunks of 12 tokens: prompts span blocks, and prefill continues over
# cached context, so both attention kernels run.
CONFIG = {"block_size": 4, "max_num_batched_tokens": 12, "num_kv_blocks": 256, "max_num_seqs": 4}

CHILD = """
import json, sys
import gpu.backends.choose
from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.kernels.triton.kernels import TritonKernels, triton_kernels
from gpu.loading.loader import load_model
from ops.models.offline import run_all
from gpu.sequence import SamplingParams

assert triton_kernels() is not None, "TRITON_INTERPRET=1 but Triton cannot run"
gpu.backends.choose.step_kernels = lambda model, config: TritonKernels()
job = json.loads(open(sys.argv[1]).read())
out = {}
for arch, path in job["models"].items():
    model = load_model(path)
    for mode in job["modes"]:
        graphs, _, spec = mode.partition("+")
        config = EngineConfig(decode_graphs=graphs, speculative=spec or None, **job["config"])
        engine = Engine(model, config)
        assert engine.attention_kernel == "triton-paged", engine.attention_kernel
        requests = [
            EngineRequest(str(i), p, SamplingParams(max_new_tokens=n, ignore_eos=True))
            for i, (p, n) in enumerate(job["prompts"][arch])
        ]
        result = run_all(engine, requests)
        out[f"{arch}/{mode}"] = [c.token_ids for c in result.completions]
open(sys.argv[2], "w").write(json.dumps(out))
"""


def _prompts(vocab: int) -> list[tuple[list[int], int]]:
    prompts = random_prompts(vocab, 3, seed=21, low=3, high=16)
    return [(p * 2, 4 + 2 * i) for i, p in enumerate(prompts)]  # repeated: guesses match


@pytest.fixture(scope="module")
def triton_tokens(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("triton-engine")
    models = {arch: str(tiny_checkpoints[arch]) for arch in ARCHS}
    prompts = {
        arch: _prompts(load_model(tiny_checkpoints[arch]).config.vocab_size) for arch in ARCHS
    }
    job = {"models": models, "modes": MODES, "config": CONFIG, "prompts": prompts}
    (folder / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-c", CHILD, str(folder / "job.json"), str(folder / "out.json")],
        check=True,
        cwd=ROOT,
        env=env,
        timeout=600,  # bounds a hang only
    )
    return prompts, json.loads((folder / "out.json").read_text())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ARCHS)
def test_triton_engine_tokens_equal_the_pytorch_path(
    tiny_checkpoints: dict[str, Path],
    triton_tokens,
    arch: str,
    mode: str,  # type: ignore[no-untyped-def]
) -> None:
    prompts, outputs = triton_tokens
    model = load_model(tiny_checkpoints[arch])
    from gpu.engine_config import EngineConfig

    config = replace(EngineConfig(**CONFIG), native_kernels=False)  # PyTorch ops, SDPA
    requests = [
        EngineRequest(str(i), p, SamplingParams(max_new_tokens=n, ignore_eos=True))
        for i, (p, n) in enumerate(prompts[arch])
    ]
    reference = [c.token_ids for c in run_all(Engine(model, config), requests).completions]
    assert outputs[f"{arch}/{mode}"] == reference
