"""Reading a GGUF file (llama.cpp's single-file format) into a `Checkpoint`.

Metadata becomes a `ModelConfig`; each tensor is offered under its Hugging Face name and
`[out_features, in_features]` layout, and dequantized (`gpu.loading.gguf_quants`) only when the
model reads it, straight to the model's dtype: loading holds the final weights and one tensor in
flight, never the whole model in float32. `GGUFTensors.quantized` hands a block-quantized weight
out as a `QuantizedWeight` instead, with no float copy at all. llama.cpp's Q/K row permutation
is undone so the model code sees the rotate-half RoPE convention of HF checkpoints, and Gemma's
norms, which llama.cpp stores as (1 + w), are shifted back to HF's w, as transformers does when
it reads the file. The tokenizer is rebuilt from `tokenizer.ggml.*` by `gpu.loading.gguf_tokenizer`.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu.errors import CheckpointError, UnsupportedArchitecture
from gpu.loading.checkpoint import Checkpoint
from gpu.loading.gguf_quants import dequantize, to_quantized
from gpu.loading.gguf_reader import GGUFFormatError, GGUFHeader, GGUFTensorInfo, read_gguf
from gpu.loading.gguf_tokenizer import build_gguf_tokenizer
from gpu.loading.model_config import config_from_hf
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import ModelConfig
from gpu.quant.weight import QuantizedWeight

ARCHITECTURES = ("llama", "qwen2", "gemma3")  # general.architecture values read here
_PERMUTED_QK = ("llama",)  # convert_hf_to_gguf.py permutes q/k rows only for LlamaModel
_NORM_SHIFTED = ("gemma3",)  # convert_hf_to_gguf.py stores Gemma's norm weights as 1 + w

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 3: a norm before and after both attention and the MLP, and one per q and k head.
_GEMMA3_LAYER_TENSORS = {
    **{k: v for k, v in _LAYER_TENSORS.items() if ".bias" not in k and k != "ffn_norm.weight"},
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}


def read_gguf_config(path: Path) -> ModelConfig:
    """The model's shapes from the file's metadata alone; no tensor data is read."""
    path = Path(path)
    return _config(_open(path), path)


def read_gguf_header(path: Path) -> tuple[ModelConfig, Tokenizer, int]:
    """Config, tokenizer and the header's size in bytes, from one parse of the metadata.

    No tensor data is read (the benchmark's echo engine needs no weights).
    """
    path = Path(path)
    header = _open(path)
    config = _config(header, path)
    tokenizer = build_gguf_tokenizer(_Meta(header, path), config)
    return config, tokenizer, int(header.data_offset)


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Config, weights under HF names (dequantized to `dtype` as each is read), and tokenizer.

    Every tensor's name and shape is checked here; the data is read when the model takes it.
    """
    path = Path(path)
    header = _open(path)
    config = _config(header, path)
    tensors = GGUFTensors(header, config, path, dtype)
    tokenizer = build_gguf_tokenizer(_Meta(header, path), config)
    return Checkpoint(config=config, tensors=tensors, tokenizer=tokenizer, files=[path])


def _open(path: Path) -> GGUFHeader:
    if not path.is_file():
        raise CheckpointError(path, "no such file")
    try:
        return read_gguf(path)
    except (GGUFFormatError, OSError) as exc:
        raise CheckpointError(
            path,
            f"not a readable GGUF file ({path.stat().st_size} bytes; truncated or corrupt?): {exc}",
        ) from exc


class _Meta:
    """Typed access to GGUF metadata, failing with the key's name."""

    def __init__(self, header: GGUFHeader, path: Path) -> None:
        self.fields = header.fields
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.fields:
            raise CheckpointError(self.path, f"GGUF metadata key {key!r} is missing")
        return self.fields[key]

    def count(self, key: str) -> int | None:
        """Length of an array field."""
        value = self.fields.get(key)
        return None if value is None else len(value)


def _config(header: GGUFHeader, path: Path) -> ModelConfig:
    meta = _Meta(header, path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            path,
            f"GGUF general.architecture {arch!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})",
        )
    if meta.get(f"{arch}.expert_count", 0):
        raise UnsupportedArchitecture(path, "mixture-of-experts GGUF models are not supported")
    names = {t.name for t in header.tensors}
    if "rope_freqs.weight" in names:
        raise CheckpointError(
            path, "per-dimension RoPE frequency factors (rope_freqs.weight) are not supported"
        )
    try:
        hidden = int(meta.require(f"{arch}.embedding_length"))
        heads = int(meta.require(f"{arch}.attention.head_count"))
        head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
        rope_dims = meta.get(f"{arch}.rope.dimension_count")
        if rope_dims is not None and int(rope_dims) != head_dim:
            raise CheckpointError(
                path, f"partial rotary embedding ({rope_dims} of {head_dim} dims) is not supported"
            )
        vocab = meta.get(f"{arch}.vocab_size") or meta.count("tokenizer.ggml.tokens")
        if vocab is None:
            raise CheckpointError(path, "no vocab_size and no tokenizer.ggml.tokens in metadata")
        eos_ids: list[int] = []
        for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
            token_id = meta.get(f"tokenizer.ggml.{key}")
            if token_id is not None and int(token_id) not in eos_ids:
                eos_ids.append(int(token_id))
        bos = meta.get("tokenizer.ggml.bos_token_id")
        if arch == "gemma3":
            return _gemma3_config(meta, path, int(vocab), "output.weight" not in names, eos_ids)
        return ModelConfig(
            arch=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            num_layers=int(meta.require(f"{arch}.block_count")),
            num_heads=heads,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            intermediate_size=int(meta.require(f"{arch}.feed_forward_length")),
            max_position_embeddings=int(meta.get(f"{arch}.context_length", 2048)),
            norm_eps=float(meta.require(f"{arch}.attention.layer_norm_rms_epsilon")),
            tie_word_embeddings="output.weight" not in names,
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(meta, arch),
            attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=tuple(eos_ids),
        )
    except (TypeError, ValueError) as exc:  # e.g. a per-layer array where a number belongs
        raise CheckpointError(path, f"bad GGUF metadata value: {exc}") from exc


def _gemma3_config(
    meta: _Meta, path: Path, vocab: int, tied: bool, eos_ids: list[int]
) -> ModelConfig:
    """Gemma 3 as transformers reads it from a GGUF: the metadata renamed to `config.json` keys.

    What the file does not say comes from transformers' `Gemma3TextConfig` defaults, as when
    transformers loads the file: every 6th layer global (the rest sliding), local RoPE base
    10000, query_pre_attn_scalar 256, no soft-capping; `config_from_hf` applies the same.
    """
    head_dim = int(meta.require("gemma3.attention.key_length"))
    value_dim = int(meta.get("gemma3.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise CheckpointError(path, f"key_length {head_dim} != value_length {value_dim}")
    if meta.get("gemma3.rope.scaling.type") not in (None, "none"):
        raise UnsupportedArchitecture(path, "RoPE scaling on a gemma3 GGUF is not supported")
    heads = int(meta.require("gemma3.attention.head_count"))
    raw: dict[str, Any] = {
        "model_type": "gemma3_text",
        "vocab_size": vocab,
        "hidden_size": int(meta.require("gemma3.embedding_length")),
        "num_hidden_layers": int(meta.require("gemma3.block_count")),
        "intermediate_size": int(meta.require("gemma3.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("gemma3.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta.get("gemma3.context_length", 131_072)),
        "rms_norm_eps": float(meta.require("gemma3.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("gemma3.rope.freq_base", 1_000_000.0)),
        "sliding_window": int(meta.get("gemma3.attention.sliding_window", 4096)),
        "tie_word_embeddings": tied,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos_ids or None,
    }
    return config_from_hf(raw, path)


def _rope_scaling(meta: _Meta, arch: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind is None and (legacy := meta.get(f"{arch}.rope.scale_linear")):
        kind, factor = "linear", legacy
    if kind in (None, "none") or (kind == "linear" and float(factor or 1.0) == 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        original = meta.get(f"{arch}.rope.scaling.original_context_length")
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := meta.get(f"{arch}.rope.scaling.{gguf_key}")) is not None:
                scaling[hf_key] = float(value)
        return scaling
    raise CheckpointError(meta.path, f"RoPE scaling type {kind!r} is not supported")


def _expected_tensors(config: ModelConfig) -> dict[str, tuple[str, tuple[int, ...], bool]]:
    """GGUF name → (HF name, HF shape, required)."""
    h, q, kv, i = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    d = config.head_dim
    shapes = {
        "token_embd.weight": (config.vocab_size, h),
        "output_norm.weight": (h,),
        "output.weight": (config.vocab_size, h),
        "attn_norm.weight": (h,),
        "attn_q.weight": (q, h),
        "attn_k.weight": (kv, h),
        "attn_v.weight": (kv, h),
        "attn_output.weight": (h, q),
        "attn_q.bias": (q,),
        "attn_k.bias": (kv,),
        "attn_v.bias": (kv,),
        "attn_q_norm.weight": (d,),
        "attn_k_norm.weight": (d,),
        "post_attention_norm.weight": (h,),
        "ffn_norm.weight": (h,),
        "post_ffw_norm.weight": (h,),
        "ffn_gate.weight": (i, h),
        "ffn_up.weight": (i, h),
        "ffn_down.weight": (h, i),
    }
    layer_tensors = _GEMMA3_LAYER_TENSORS if config.arch == "gemma3" else _LAYER_TENSORS
    expected = {
        name: (hf, shapes[name], name != "output.weight" or not config.tie_word_embeddings)
        for name, hf in _GLOBAL_TENSORS.items()
    }
    for layer in range(config.num_layers):
        for name, hf in layer_tensors.items():
            required = not name.endswith(".bias") or config.attention_bias
            expected[f"blk.{layer}.{name}"] = (
                f"model.layers.{layer}.{hf}",
                shapes[name],
                required,
            )
    return expected


class GGUFTensors(Mapping[str, torch.Tensor]):
    """A GGUF file's tensors under their HF names; each is dequantized when it is read.

    Names and shapes are checked once, up front. Reading a name dequantizes that tensor (again,
    if it is read twice) to `dtype`: a model copying its weights in holds one at a time.
    """

    def __init__(
        self, header: GGUFHeader, config: ModelConfig, path: Path, dtype: torch.dtype
    ) -> None:
        self.config, self.path, self.dtype = config, path, dtype
        self._tensors = _checked_tensors(header, config, path)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor, shape = self._tensors[name]
        config = self.config
        shifted = config.arch in _NORM_SHIFTED and tensor.name.endswith("norm.weight")
        # Norms are shifted in float32 (then rounded once), as transformers does.
        dtype = torch.float32 if shifted else self.dtype
        try:
            weights = dequantize(tensor.data, tensor.tensor_type, shape, dtype)
        except (NotImplementedError, ValueError, TypeError) as exc:
            raise CheckpointError(
                self.path,
                f"tensor {tensor.name!r} ({tensor.tensor_type.name}) cannot be dequantized: {exc}",
            ) from exc
        _drop_pages(tensor.data)
        if shifted:
            weights = (weights - 1.0).to(self.dtype)
        if heads := self._permuted_heads(tensor.name):
            weights = _unpermute_qk(weights, heads)
        return weights

    def quantized(self, name: str) -> QuantizedWeight | None:
        """A 2-D weight kept as the file's integers and group scales (`to_quantized`), equal to
        `self[name]` in float32 once dequantized; None where the type does not map without loss
        (float tensors, norms, other block types): read those with `self[name]`."""
        tensor, shape = self._tensors[name]
        if self.config.arch in _NORM_SHIFTED and tensor.name.endswith("norm.weight"):
            return None  # stored as 1 + w; only `self[name]` shifts it back
        try:
            weight = to_quantized(tensor.data, tensor.tensor_type, shape)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(
                self.path,
                f"tensor {tensor.name!r} ({tensor.tensor_type.name}) is unreadable: {exc}",
            ) from exc
        if weight is None:
            return None
        _drop_pages(tensor.data)
        if heads := self._permuted_heads(tensor.name):  # the same un-permutation, as a row gather
            weight = weight.rows(_unpermute_qk(torch.arange(weight.out_features), heads))
        return weight

    def _permuted_heads(self, gguf_name: str) -> int | None:
        """The head count whose q/k rows llama.cpp's converter permuted in this tensor, if any."""
        if self.config.arch not in _PERMUTED_QK:
            return None
        if ".attn_q." in gguf_name:
            return self.config.num_heads
        if ".attn_k." in gguf_name:
            return self.config.num_kv_heads
        return None


def _drop_pages(data: np.ndarray) -> None:
    """Let the kernel drop the mapped pages of a tensor's data from this process.

    Touched pages of a file mapping count in the process's resident memory until it is
    unmapped; the header's map lives as long as the checkpoint, so without this a load ends
    holding the whole file beside the weights. The pages stay in the page cache, and anything
    still viewing them (an F32 tensor returned as is) reads them back from there.
    """
    view = data.base
    buffer = view.obj if isinstance(view, memoryview) else None
    if not isinstance(buffer, mmap.mmap) or data.nbytes == 0:
        return
    start = data.ctypes.data - np.frombuffer(buffer, np.uint8, 1).ctypes.data
    first = start - start % mmap.PAGESIZE
    buffer.madvise(mmap.MADV_DONTNEED, first, start + data.nbytes - first)


def _checked_tensors(
    header: GGUFHeader, config: ModelConfig, path: Path
) -> dict[str, tuple[GGUFTensorInfo, tuple[int, ...]]]:
    """HF name → (the file's tensor, its HF shape), every name and shape checked."""
    expected = _expected_tensors(config)
    out: dict[str, tuple[GGUFTensorInfo, tuple[int, ...]]] = {}
    for tensor in header.tensors:
        if tensor.name not in expected:
            raise CheckpointError(
                path, f"tensor {tensor.name!r} is not part of a {config.arch} model"
            )
        hf_name, shape, _ = expected[tensor.name]
        # ggml lists dimensions innermost first
        file_shape = tuple(int(d) for d in reversed(tensor.shape))
        if file_shape != shape:
            raise CheckpointError(
                path,
                f"tensor {tensor.name!r} has shape {list(file_shape)}, expected {list(shape)} "
                "for the config in the file's metadata",
            )
        out[hf_name] = (tensor, shape)
    missing = [name for name, (hf, _, required) in expected.items() if required and hf not in out]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(path, f"missing tensors: {', '.join(missing[:5])}{more}")
    return out


def _unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's `w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2)`.

    llama.cpp's RoPE rotates adjacent pairs; HF's rotates halves. The converter interleaves each
    head's two halves; reading `[n_head, d/2, 2]` and swapping back restores HF's row order.
    """
    # w: [n_head * head_dim, *rest]
    rest = w.shape[1:]
    halves = w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest)
    return halves.transpose(1, 2).reshape(w.shape).contiguous()
