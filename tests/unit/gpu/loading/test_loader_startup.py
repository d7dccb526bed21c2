"""What a load costs at start-up: loading a model imports neither torch._dynamo nor sympy
(torch reaches them from ops run on meta tensors, `torch.nn.attention.bias` and
`nn.Module.to_empty`: ~3 s of every start before they were avoided), and the loader reports
its phases' seconds (`LoadedModel.load_s`). Each load runs in a fresh interpreter: these
modules, once imported by another test, stay imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]

_LOAD = """
import json, sys
import torch
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
model = load_model(sys.argv[1], device="cpu")
engine = Engine(model, EngineConfig(max_model_len=64, num_kv_blocks=8))
print(json.dumps({"load_s": model.load_s,
                  "imported": [m for m in ("torch._dynamo", "sympy") if m in sys.modules]}))
"""


def _load(path: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, str(path)],
        capture_output=True, text=True, cwd=ROOT, check=True, timeout=300,
    )  # fmt: skip
    loaded: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "phi3", "qwen3_moe"])
def test_a_load_imports_no_compiler_and_reports_its_phases(
    tiny_checkpoints: dict[str, Path], arch: str
) -> None:
    loaded = _load(tiny_checkpoints[arch])

    assert loaded["imported"] == []
    load_s = loaded["load_s"]
    assert isinstance(load_s, dict)
    assert list(load_s) == ["checkpoint", "build", "weights", "kernels", "digest"]
    assert all(isinstance(s, float) and s >= 0 for s in load_s.values())


def test_the_real_gguf_loads_without_them_too(smollm2_path: Path) -> None:
    assert _load(smollm2_path)["imported"] == []
