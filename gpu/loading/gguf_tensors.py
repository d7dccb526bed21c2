"""A GGUF file's tensors under their Hugging Face names and `[out_features, in_features]`
layout (`GGUFTensors`), every name and shape checked up front, each tensor dequantized only when
the model reads it (or handed out kept quantized).

llama.cpp's Q/K row permutation is undone so the model code sees the rotate-half RoPE
convention of HF checkpoints, and Gemma's norms, which llama.cpp stores as (1 + w), are shifted
back to HF's w, as transformers does when it reads the file.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

from gpu.errors import CheckpointError
from gpu.loading.gguf_quants import dequantize, to_quantized
from gpu.loading.gguf_reader import GGUFHeader, GGUFTensorInfo
from gpu.model_config import ModelConfig
from gpu.quantized_weight import QuantizedWeight

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
