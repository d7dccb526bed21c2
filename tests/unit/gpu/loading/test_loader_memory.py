"""Loading holds the final weights and one tensor in flight: peak host RSS is bounded.

Each real model is loaded in a fresh subprocess on the CPU, where the device is host memory:
the bound is `peak RSS ≤ baseline + 1.3 × model bytes + ALLOWANCE`, with `baseline` the RSS
once torch and tokenmill are imported (before anything of the model is read) and `model bytes`
everything the loaded model holds: parameters and buffers (the RoPE tables), plus, for float32
on CPU, the oneDNN-packed copies of the linear weights (`LoadedModel.packed_bytes`).
ALLOWANCE covers what loading costs beyond the weights whatever the model's size: libtorch's
code pages and CPU runtime faulted in on first use (~160 MiB measured with SmolLM2, the model
construction alone), and the tokenizer (Gemma 3's 262,144-token vocabulary: ~120 MiB held,
more while it is built). Measured 2026-12-01 (MiB; peak above baseline / model bytes, the
baseline 541 MiB): SmolLM2 f32 1228 / 1030 (1.19×, 513 of it packed), bf16 512 / 261 (1.96×);
Gemma 3 270M f32 2455 / 2173 (1.13×, 1022 packed), bf16 1081 / 639 (1.69×). Before the GGUF's
mapped pages were dropped tensor by tensor, a load ended holding the whole file beside the
weights (+82 MiB at SmolLM2's peak, +158 at Gemma 3's in bfloat16). The same shapes as a
sharded bfloat16 safetensors folder: f32 1206 / 1030 (1.17×), bf16 433 / 261 (1.66×); read
whole with `safetensors.torch.load_file`, as it was, 1462 (1.42×) and 689 (2.65×).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpu.errors import CheckpointError
from gpu.loading.checkpoint import SafetensorsTensors
from gpu.loading.loader import load_checkpoint, load_model

ALLOWANCE = 320 << 20
RATIO = 1.3
ROOT = Path(__file__).resolve().parents[4]

_MEASURE = """
import json, sys
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key))
import torch
from gpu.loading.loader import load_model
baseline = status("VmRSS:")
model = load_model(sys.argv[1], dtype=getattr(torch, sys.argv[2]), device="cpu")
storages = {}
for t in [*model.module.parameters(), *model.module.buffers()]:
    if t.layout == torch.strided and not t.is_mkldnn:  # the packed copies: packed_bytes
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
print(json.dumps({"baseline": baseline, "peak": status("VmHWM:"),
                  "weights": sum(storages.values()), "packed": model.packed_bytes}))
"""


def measure(path: Path, dtype: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), dtype],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    figures: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


@pytest.fixture(scope="module")
def smollm2_safetensors_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight bfloat16 HF folder of SmolLM2-135M's shapes, in three shards."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tests.tiny_models import SPECIAL, train_tokenizer

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("smollm2_safetensors")
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="100MB", safe_serialization=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": SPECIAL, "bos_token": SPECIAL})
    )
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["smollm2", "gemma3", "smollm2_safetensors"])
def test_peak_rss_while_loading(model: str, dtype: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(f"{model}_path")
    r = measure(path, dtype)
    model_bytes = r["weights"] + r["packed"]
    extra = r["peak"] - r["baseline"]
    bound = RATIO * model_bytes + ALLOWANCE
    mib = 1 << 20
    figures = (
        f"{model} {dtype}: baseline {r['baseline'] / mib:.0f} MiB, peak {r['peak'] / mib:.0f} "
        f"MiB (+{extra / mib:.0f}), model {model_bytes / mib:.0f} MiB (packed "
        f"{r['packed'] / mib:.0f}), (peak - baseline) / model {extra / model_bytes:.2f}, "
        f"bound +{bound / mib:.0f} MiB"
    )
    print(figures)
    assert extra <= bound, figures


@pytest.fixture
def sharded(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    """The tiny llama checkpoint as it was and saved again in shards (with an index)."""
    from transformers import AutoModelForCausalLM

    original = tiny_checkpoints["llama"]
    folder = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(original).save_pretrained(
        folder, max_shard_size="100KB", safe_serialization=True
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((original / name).read_bytes())
    return original, folder


def test_sharded_safetensors_load_lazily_and_equal_the_single_file(
    sharded: tuple[Path, Path],
) -> None:
    original, folder = sharded
    checkpoint = load_checkpoint(folder)
    assert len(checkpoint.files) > 2 and (folder / "model.safetensors.index.json").is_file()
    assert isinstance(checkpoint.tensors, SafetensorsTensors)
    expected = load_file(str(original / "model.safetensors"))
    assert set(checkpoint.tensors) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(checkpoint.tensors[name], tensor), name
    whole, shards = (
        load_model(original, dtype=torch.bfloat16),
        load_model(folder, dtype=torch.bfloat16),
    )
    for (name, a), (_, b) in zip(
        whole.module.state_dict().items(), shards.module.state_dict().items(), strict=True
    ):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert whole.digest != shards.digest  # the digest is of the files, which differ


def test_a_damaged_shard_names_the_file(sharded: tuple[Path, Path]) -> None:
    _, folder = sharded
    shard = sorted(folder.glob("*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        load_model(folder)
    assert shard.name in str(info.value)
