"""Writing a loaded (partly quantized) model as a folder tokenmill loads: `tokenmill quantize`'s
output.

    DIR/model.safetensors        every tensor under its Hugging Face name (no pickle)
    DIR/config.json              the model's config, with a `quantization_config`
    DIR/tokenizer.json           the tokenizer, as `tokenizers` saves it
    DIR/tokenizer_config.json    bos / eos tokens and the chat template
    DIR/generation_config.json   copied from an HF source, where it has one

Weights are written as the model holds them: q/k/v and gate/up fused
(`model.layers.N.self_attn.qkv_proj.weight`, `.mlp.gate_up_proj.weight`, which
`gpu.models.layers.load_attention`/`load_gated_mlp` read back as they are), a quantized
matrix as `<name>_q`, `<name>_scales` and, for int4, `<name>_offsets` (`WeightSource.take_linear`);
a tied head only once, as the embedding table. `quantization_config` records the scheme, the
layers kept in float, and the sha256 of model.safetensors, which `gpu.loading.checkpoint`
checks on every load. Dense Llama-family and Gemma models; an HF source's config.json is
copied, a GGUF's config written from its ModelConfig (`hf_config`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from gpu.loading.checkpoint import file_sha256
from gpu.loading.loader import LoadedModel
from gpu.model_config import GEMMA_FAMILY, LLAMA_FAMILY, MOE_ARCHS, ModelConfig

WEIGHTS = "model.safetensors"
QUANT_METHOD = "tokenmill"


def write_checkpoint(
    model: LoadedModel, source: Path, out: Path, quantization: dict[str, Any]
) -> Path:
    """Write `model` into the folder `out` (created; weight files and ours replaced, others
    left). `quantization` goes into config.json's `quantization_config`, with `quant_method`
    and the weights' sha256 added. `source` is the checkpoint the model was loaded from: an
    HF folder's config.json and generation_config.json are copied (a GGUF's config is
    written from `model.config`)."""
    config = model.config
    supported(config, source)
    out.mkdir(parents=True, exist_ok=True)
    for stale in (*out.glob("*.safetensors"), out / "model.safetensors.index.json"):
        stale.unlink(missing_ok=True)  # an older checkpoint's weights would load beside ours
    weights = out / WEIGHTS
    save_file(hf_tensors(model.module, config), str(weights), metadata={"format": "pt"})
    raw = _source_config(source) if source.is_dir() else hf_config(config)
    raw["quantization_config"] = {
        "quant_method": QUANT_METHOD,
        **quantization,
        "sha256": {WEIGHTS: file_sha256(weights)},
    }
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    generation = source / "generation_config.json"
    if source.is_dir() and generation.is_file():
        shutil.copyfile(generation, out / "generation_config.json")
    write_tokenizer(model, out)
    return out


def supported(config: ModelConfig, source: Path) -> None:
    """Raise ValueError unless this writer can write the model (checked before any work)."""
    if config.arch not in (*LLAMA_FAMILY, *GEMMA_FAMILY) or config.arch in MOE_ARCHS:
        raise ValueError(
            f"tokenmill quantize writes dense Llama-family and Gemma models, not {config.arch}"
        )
    if not source.is_dir():
        hf_config(config)  # raises for what a config.json cannot say


def hf_tensors(module: nn.Module, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The module's weights under the names the loaders read, on the host, each its own
    storage (safetensors refuses tensors that share memory)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in module.state_dict().items():
        if name.startswith("lm_head.") and config.tie_word_embeddings:
            continue  # the embedding table is the head
        hf = name if name.startswith("lm_head.") else "model." + name
        if hf.endswith("self_attn.qkv_proj.bias"):  # the loaders take q, k, v biases apart
            prefix = hf.removesuffix("qkv_proj.bias")
            parts = tensor.split([config.q_size, config.kv_size, config.kv_size])
            for part, proj in zip(parts, ("q_proj", "k_proj", "v_proj"), strict=True):
                out[f"{prefix}{proj}.bias"] = part.detach().cpu().clone()
            continue
        out[hf] = tensor.detach().cpu().contiguous().clone()
    return out


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """A Hugging Face config.json for a model read from a GGUF, which
    `gpu.loading.model_config.config_from_hf` reads back into an equal ModelConfig: dense
    Llama, Mistral, Qwen2, Qwen3 (not Phi-3: LongRoPE comes from HF folders only), Gemma 2 and 3."""
    raw: dict[str, Any] = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "rope_theta": config.rope_theta,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids),
    }
    if config.rope_scaling is not None:
        raw["rope_scaling"] = dict(config.rope_scaling)
    if config.sliding_window is not None:
        raw["sliding_window"] = config.sliding_window
    if config.arch in GEMMA_FAMILY:
        return raw | _gemma_fields(config)
    return raw | _llama_fields(config)


def _llama_fields(config: ModelConfig) -> dict[str, Any]:
    arch = config.arch
    if arch not in LLAMA_FAMILY or arch in MOE_ARCHS or arch == "phi3":
        raise ValueError(f"cannot write a config.json for {arch} from a GGUF's metadata")
    # config_from_hf's rules: qwen2 always has q/k/v biases and none on o_proj; the others
    # have both or neither; q/k norms are qwen3's alone.
    if arch == "qwen2":
        biases = config.attention_bias and not config.output_bias
    else:
        biases = config.attention_bias == config.output_bias
    if not biases or config.qk_norm != (arch == "qwen3") or config.layer_types is not None:
        raise ValueError(f"{arch}'s config has settings a config.json cannot express")
    fields: dict[str, Any] = {
        "model_type": arch,
        "hidden_act": config.activation,
        "partial_rotary_factor": config.partial_rotary_factor,
    }
    if arch != "qwen2":
        fields["attention_bias"] = config.attention_bias
    if config.sliding_window is not None:
        fields["use_sliding_window"] = True  # qwen2/qwen3 ignore the window without it
    return fields


def _gemma_fields(config: ModelConfig) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "model_type": "gemma3_text" if config.arch == "gemma3" else config.arch,
        "hidden_activation": config.activation,
        "attention_bias": config.attention_bias,
        "query_pre_attn_scalar": config.query_pre_attn_scalar,
    }
    if config.layer_types is not None:
        fields["layer_types"] = list(config.layer_types)
    if config.rope_local_theta is not None:
        fields["rope_local_base_freq"] = config.rope_local_theta
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, name) is not None:
            fields[name] = getattr(config, name)
    return fields


def _source_config(folder: Path) -> dict[str, Any]:
    raw = json.loads((folder / "config.json").read_text())  # the loader has read it already
    if not isinstance(raw, dict):
        raise ValueError(f"{folder / 'config.json'} is not a JSON object")
    raw.pop("quantization_config", None)  # a quantized source's (ours replaces it)
    return raw


def write_tokenizer(model: LoadedModel, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json, as `gpu.loading.tokenizer.Tokenizer.from_hf_folder`
    reads them back."""
    tokenizer = model.tokenizer
    tokenizer.inner.save(str(out / "tokenizer.json"))
    settings: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if tokenizer.bos_token is not None:
        settings["bos_token"] = tokenizer.bos_token
    if tokenizer.eos_token is not None:
        settings["eos_token"] = tokenizer.eos_token
    if tokenizer.chat_template is not None:
        settings["chat_template"] = tokenizer.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
