"""Loading with `--quantization`: which layers end up quantized, what they hold in memory
(against the planner's arithmetic and, for GGUFs kept quantized, the file's size), tied heads,
and that a quantized engine generates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.checkpoint_header import gguf_kept_weights_bytes
from gpu.loading.loader import load_model
from gpu.memory.held_bytes import weight_bytes
from gpu.memory.model_sizes import weights_bytes
from gpu.quant.linear import QuantizedEmbedding, QuantizedLinear
from gpu.sequence import SamplingParams
from ops.models.offline import run_all

pytestmark = pytest.mark.slow


def _greedy(model: object, prompt: list[int], n: int = 12) -> list[int]:
    engine = Engine(model, EngineConfig(max_model_len=256, num_kv_blocks=64))  # type: ignore[arg-type]
    params = SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
    run = run_all(engine, [EngineRequest("r", list(prompt), params)])
    return run.completions[0].token_ids


@pytest.mark.parametrize("scheme", ["int8", "int4", "int4-g128"])
def test_int8_int4_hold_what_the_plan_counts_and_tie_the_head(
    smollm2_path: Path, scheme: str
) -> None:
    model = load_model(smollm2_path, quantization=scheme)
    module = model.module
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    assert not linears, "every linear layer is quantized"
    head, table = module.lm_head, module.embed_tokens
    assert isinstance(head, QuantizedLinear) and isinstance(table, QuantizedEmbedding)
    assert head.weight_q.data_ptr() == table.weight_q.data_ptr()  # one matrix, tied
    assert weight_bytes(module) == weights_bytes(model.config, "float32", scheme)
    assert model.quantization.startswith(scheme.split("-")[0])


def test_a_quantized_engine_generates_as_its_dequantized_weights_do(smollm2_path: Path) -> None:
    """int8 through the quantized kernels against the same int8 values as float weights."""
    quantized = load_model(smollm2_path, quantization="int8")
    reference = load_model(smollm2_path, pack=False)
    with torch.no_grad():
        for name, layer in quantized.module.named_modules():
            if isinstance(layer, QuantizedLinear):
                reference.module.get_submodule(name).weight.copy_(layer.qweight.dequantize())
    prompt = quantized.tokenizer.encode("The capital of France is")
    tokens = _greedy(quantized, prompt)
    assert tokens == _greedy(reference, prompt)
    text = quantized.tokenizer.decode(tokens)
    assert text.strip(), text


@pytest.mark.parametrize("alias", ["smollm2", "gemma3"])
def test_auto_keeps_a_gguf_quantized_within_one_and_a_half_times_the_file(
    alias: str, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(f"{alias}_path")
    model = load_model(path, quantization="auto")
    held = weight_bytes(model.module)
    ratio = held / os.path.getsize(path)
    print(f"{alias}: weights {held / 2**20:.1f} MiB = {ratio:.3f} × the file")
    assert ratio <= 1.5
    assert held == gguf_kept_weights_bytes(path, 4)  # the planner counts the same
    assert "int4-g32" in model.quantization
    prompt = model.tokenizer.encode("Once upon a time")
    assert len(_greedy(model, prompt, 4)) == 4


def test_none_dequantizes_as_before(smollm2_path: Path) -> None:
    model = load_model(smollm2_path)
    assert model.quantization == "none"
    assert not any(isinstance(m, QuantizedLinear) for m in model.module.modules())


def test_keep_leaves_named_layers_in_float(smollm2_path: Path) -> None:
    keep = {"layers.0.self_attn.qkv_proj", "lm_head"}
    model = load_model(smollm2_path, quantization="int4", keep=keep, pack=False)
    for name in keep:
        assert type(model.module.get_submodule(name)) is nn.Linear
    assert isinstance(model.module.get_submodule("layers.0.mlp.down_proj"), QuantizedLinear)
    assert type(model.module.embed_tokens) is nn.Embedding  # the kept head keeps its table
    assert "float32" in model.quantization
