"""A model of a `config.json`'s shapes with random weights: benchmarks without a checkpoint.

`load_random_model(config_path)` builds the module on the meta device, materialises it on the
target device in the target dtype and fills every weight there with a seeded generator, so
an 8B model in bf16 takes its 16 GB once, on the device: nothing is built in float32 or on
the host first. Its tokenizer is a stand-in that names token ids (`<17>`): a benchmark feeds
token ids, and completions still decode to some text.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tokenizers
import torch
from torch import nn

from gpu.device import default_device, default_dtype, dtype_name
from gpu.errors import CheckpointError
from gpu.kernels.native import cpu_kernels
from gpu.loading.loader import LoadedModel, _tie_and_fill_buffers, build_module, materialize
from gpu.loading.model_config import check_activation, config_from_hf
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import ModelConfig
from gpu.models.gemma import GemmaRMSNorm
from gpu.models.layers import RMSNorm
from gpu.models.packed_linear import pack_linears, packed_bytes, packing_available
from gpu.quant.apply import quantize_linears, tie_quantized
from gpu.quant.scheme import Quantization, describe

DEFAULT_STD = 0.02  # transformers' initializer_range default, when the config has none
DIGEST_PREFIX = "random:"  # a random model's digest: never a checkpoint's "sha256:..."


def read_random_config(path: Path) -> tuple[ModelConfig, float]:
    """The config at `path` and the std its weights are drawn with (`initializer_range`).

    Raises `UnsupportedArchitecture` for a `model_type` (or rope scaling, activation) the
    engine does not implement, `CheckpointError` for a file that is not a usable config.
    """
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"cannot read the config: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(path, "a config.json holds one JSON object")
    config = config_from_hf(raw, Path(path))
    check_activation(config, Path(path))
    return config, float(raw.get("initializer_range") or DEFAULT_STD)


def load_random_model(
    config_path: Path,
    *,
    name: str | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    pack: bool = True,
    quantization: str | Quantization = "none",
) -> LoadedModel:
    """A `LoadedModel` of `config_path`'s shapes, weights drawn on `device` in `dtype`.

    Linear and embedding weights ~ N(0, initializer_range²), biases 0, norms at their
    identity (scale 1). `pack` and `quantization` as for `gpu.loading.loader.load_model`.
    """
    config_path = Path(config_path)
    config, std = read_random_config(config_path)
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    scheme = Quantization.parse(quantization)
    with torch.device("meta"):
        module = build_module(config, config.max_position_embeddings)
    module = materialize(module.to(dtype=dtype), device).eval()
    _tie_and_fill_buffers(module, config, device)
    fill_random(module, std, seed)
    if scheme.quantizes_floats:
        quantize_linears(module, scheme, ())
    tie_quantized(module, config)
    if pack and packing_available(device, dtype):
        pack_linears(module, cpu_kernels())  # in panels where the native kernels build
    digest = hashlib.sha256(config_path.read_bytes()).hexdigest()
    return LoadedModel(
        name=name or f"{config_path.stem} (random weights)",
        # not a checkpoint's digest: the config's bytes and the draw
        digest=f"{DIGEST_PREFIX}seed{seed}:{dtype_name(dtype)}:sha256:{digest}",
        path=config_path,
        config=config,
        tokenizer=id_tokenizer(config),
        module=module,
        dtype=dtype,
        device=device,
        packed_bytes=packed_bytes(module),
        quantization=describe(module, dtype),
    )


def has_random_weights(model: LoadedModel) -> bool:
    return model.digest.startswith(DIGEST_PREFIX)


def fill_random(module: nn.Module, std: float, seed: int) -> None:
    """Fill every parameter in place on its own device and in its own dtype (a generator on
    that device: no host copy); a tied weight is filled once."""
    device = next(module.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for owner in module.modules():
            for attr, param in owner.named_parameters(recurse=False):
                if param.data_ptr() in seen:
                    continue
                seen.add(param.data_ptr())
                if isinstance(owner, GemmaRMSNorm):  # scales by 1 + weight
                    param.zero_()
                elif isinstance(owner, (RMSNorm, nn.LayerNorm)) and attr == "weight":
                    param.fill_(1.0)
                elif attr == "bias" or param.dim() < 2:
                    param.zero_()
                else:
                    param.normal_(0.0, std, generator=generator)


def id_tokenizer(config: ModelConfig) -> Tokenizer:
    """A tokenizer that names each id (`<17>`) and decodes ids to those names; EOS as the
    config says (none: the last id, so the workload's prompts still avoid one)."""
    vocab = {f"<{i}>": i for i in range(config.vocab_size)}
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<0>"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    eos = config.eos_token_ids or (config.vocab_size - 1,)
    return Tokenizer(inner, eos_token_ids=eos, eos_token=f"<{eos[0]}>")
