"""From a checkpoint path to a model ready to run: `load_model(path) -> LoadedModel`."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from gpu.device import default_device, default_dtype
from gpu.errors import CheckpointError
from gpu.kernels.native import cpu_kernels
from gpu.loading.checkpoint import Checkpoint, load_hf_folder
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import GEMMA_FAMILY, ModelConfig
from gpu.models.gemma import GemmaForCausalLM
from gpu.models.gpt2 import GPT2ForCausalLM
from gpu.models.layers import WeightSource, rope_tables
from gpu.models.llama import LlamaForCausalLM
from gpu.models.packed_linear import (
    linear_kernel,
    pack_linears,
    packed_bytes,
    packing_available,
)
from gpu.quant.apply import quantize_linears, tie_quantized
from gpu.quant.scheme import Quantization, describe


@dataclass
class LoadedModel:
    """A model in device memory with its tokenizer. `digest` identifies the weights' content."""

    name: str
    digest: str  # "sha256:<hex>" over the weight files' bytes
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    module: nn.Module
    dtype: torch.dtype
    device: torch.device
    packed_bytes: int = 0  # what the packed copies hold beyond the parameters
    quantization: str = "none"  # the linear weights' formats (`gpu.quant.scheme.describe`)
    # Seconds by phase: checkpoint (config, tokenizer, tensor index), build, weights (read,
    # dequantized, copied in), kernels (native kernels built or loaded, linears packed), digest.
    load_s: dict[str, float] = field(default_factory=dict)

    @property
    def linear_kernel(self) -> str:
        """Which kernel the linears run on: native-panels or onednn-packed when `pack_linears`
        packed them, else torch."""
        return linear_kernel(self.module)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((*self.config.eos_token_ids, *self.tokenizer.eos_token_ids)))


def load_checkpoint(path: Path, dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Load an HF folder (`config.json`, `*.safetensors`, `tokenizer.json`) or a `.gguf` file.

    `dtype`: what a GGUF's tensors are dequantized to as they are read (safetensors keep theirs).
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from gpu.loading.gguf import load_gguf  # gguf-py only when a GGUF is read

        return load_gguf(path, dtype)
    if path.is_file():
        raise CheckpointError(path, "not a checkpoint: expected a folder or a .gguf file")
    if not path.is_dir():
        raise CheckpointError(path, "no such file or folder")
    return load_hf_folder(path)


def build_module(config: ModelConfig, max_positions: int) -> nn.Module:
    if config.arch == "gpt2":
        return GPT2ForCausalLM(config, max_positions)
    if config.arch in GEMMA_FAMILY:
        return GemmaForCausalLM(config, max_positions)
    return LlamaForCausalLM(config, max_positions)


def load_model(
    path: Path,
    *,
    name: str | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    pack: bool = True,
    quantization: str | Quantization = "none",
    keep: Collection[str] = (),
) -> LoadedModel:
    """Read a checkpoint (HF folder or .gguf), build the model and move it to the device.

    `pack`: reorder the linear weights for oneDNN (`gpu.models.packed_linear`) wherever that
    is available (float32 on CPU); False keeps `nn.Linear` (`F.linear`) everywhere.
    `quantization`: see `gpu.quant.scheme` (`none`, `auto`, `int8`, `int4[-g32|-g128]`);
    `keep`: linear layers (module names) `int8`/`int4` leave in the compute dtype.
    Raises `CheckpointError` (naming the file and the problem) when anything is wrong.
    """
    path = Path(path)
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    scheme = Quantization.parse(quantization)
    lap = _Laps()
    ckpt = load_checkpoint(path, dtype)
    lap("checkpoint")
    with torch.device("meta"):
        module = build_module(ckpt.config, ckpt.config.max_position_embeddings)
    # Materialise straight on the device in the compute dtype, then copy each weight in: the
    # host never holds a second, converted copy of the model.
    module = materialize(module.to(dtype=dtype), device).eval()
    _tie_and_fill_buffers(module, ckpt.config, device)
    lap("build")
    src = WeightSource(ckpt.tensors, path, keep_quantized=scheme.keeps_file_quantization)
    module.load_weights(src)  # type: ignore[operator]
    if scheme.quantizes_floats:
        quantize_linears(module, scheme, keep)
    tie_quantized(module, ckpt.config)
    lap("weights")
    if pack and packing_available(device, dtype):
        pack_linears(module, cpu_kernels())  # in panels where the native kernels build
    lap("kernels")
    default_name = path.stem if path.is_file() else path.name
    digest = content_digest(ckpt.files)
    lap("digest")
    return LoadedModel(
        name=name or default_name,
        digest=digest,
        path=path,
        config=ckpt.config,
        tokenizer=ckpt.tokenizer,
        module=module,
        dtype=dtype,
        device=device,
        packed_bytes=packed_bytes(module),
        quantization=describe(module, dtype),
        load_s=lap.laps,
    )


class _Laps:
    """Seconds each phase of a load took, by name, in the order they ran."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.laps[phase] = round(now - self._last, 3)
        self._last = now


def materialize(module: nn.Module, device: torch.device) -> nn.Module:
    """A module built on the meta device, its tensors now uninitialised on `device` (what
    `nn.Module.to_empty` does, whose `empty_like` on meta tensors imports sympy: 0.3 s)."""

    def empty(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype, device=device)

    module._apply(empty)  # type: ignore[no-untyped-call]  # as `to_empty` does, with `empty`
    return module


def _tie_and_fill_buffers(module: nn.Module, config: ModelConfig, device: torch.device) -> None:
    """Re-tie the LM head to the embedding and (re)build the RoPE tables in float32.

    Needed once the module is materialised from the meta device: ties and buffer values are
    lost there, and positions need float32 RoPE tables whatever the compute dtype.
    """
    if isinstance(module, LlamaForCausalLM):
        cos, sin = rope_tables(config, config.max_position_embeddings)
        module.rope_cos, module.rope_sin = cos.to(device), sin.to(device)
        embed = module.embed_tokens
    elif isinstance(module, GemmaForCausalLM):
        module.fill_rope(config.max_position_embeddings, device)
        embed = module.embed_tokens
    else:
        assert isinstance(module, GPT2ForCausalLM)
        embed = module.wte
    if config.tie_word_embeddings and module.lm_head is not None:  # an encoder has none
        module.lm_head.weight = embed.weight


def content_digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for file in files:
        with file.open("rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return f"sha256:{h.hexdigest()}"
