"""gpu.loading.gguf: tiny GGUFs written here (fast); the real SmolLM2 file against transformers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from gpu.errors import CheckpointError, UnsupportedArchitecture
from gpu.loading.checkpoint import Checkpoint
from gpu.loading.gguf import load_gguf, read_gguf_config
from gpu.loading.loader import load_checkpoint

# --- tiny synthetic GGUFs -------------------------------------------------------------------

LAYERS, HIDDEN, HEADS, KV_HEADS, INTER = 2, 16, 4, 2, 24
HEAD_DIM = HIDDEN // HEADS


def _byte_alphabet() -> list[str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>"]
TOKENS = [*_byte_alphabet(), "he", "ll", "hell", "hello", *SPECIALS]
TOKEN_TYPES = [1] * (len(TOKENS) - 3) + [3, 3, 4]  # control, control, user-defined
MERGES = ["h e", "l l", "he ll", "hell o"]
IM_START, IM_END, THINK = (TOKENS.index(s) for s in SPECIALS)
VOCAB = len(TOKENS)


def _hf_weights(arch: str, *, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under HF names and layout."""
    rng = np.random.default_rng(seed)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    weights = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN), "model.norm.weight": rand(HIDDEN)}
    if not tied:
        weights["lm_head.weight"] = rand(VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": rand(HIDDEN),
            p + "self_attn.q_proj.weight": rand(q, HIDDEN),
            p + "self_attn.k_proj.weight": rand(kv, HIDDEN),
            p + "self_attn.v_proj.weight": rand(kv, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, q),
            p + "post_attention_layernorm.weight": rand(HIDDEN),
            p + "mlp.gate_proj.weight": rand(INTER, HIDDEN),
            p + "mlp.up_proj.weight": rand(INTER, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, INTER),
        }
        if arch == "qwen2":
            weights |= {
                p + "self_attn.q_proj.bias": rand(q),
                p + "self_attn.k_proj.bias": rand(kv),
                p + "self_attn.v_proj.bias": rand(kv),
            }
    return weights


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in effect."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_TO_GGUF[rest]}"


def write_tiny(
    path: Path,
    arch: str = "llama",
    *,
    tied: bool = True,
    tensors: dict[str, np.ndarray | None] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny model as llama.cpp's converter would; return its HF-layout weights.

    `tensors` replaces (or, with a value of None, drops) tensors by GGUF name; `meta` sets or
    overrides metadata keys, typed from the Python value (str, bool, int → uint32, float).
    """
    weights = _hf_weights(arch, tied=tied)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(50000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types(TOKEN_TYPES)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(IM_START)
    writer.add_eos_token_id(IM_END)
    writer.add_add_bos_token(False)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    for key, value in (meta or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_float32(key, float(value))
    out: dict[str, np.ndarray | None] = {}
    for hf, w in weights.items():
        name = _gguf_name(hf)
        if arch == "llama" and ".attn_q." in name:
            w = _llama_cpp_permute(w, HEADS)
        elif arch == "llama" and ".attn_k." in name:
            w = _llama_cpp_permute(w, KV_HEADS)
        out[name] = w
    out.update(tensors or {})
    for name, array in out.items():
        if array is not None:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "tiny.gguf"
    return path, write_tiny(path)


def test_tiny_llama_config(tiny: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = tiny
    config = read_gguf_config(path)
    assert (config.arch, config.num_layers, config.hidden_size) == ("llama", LAYERS, HIDDEN)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (HEADS, KV_HEADS, HEAD_DIM)
    assert (config.intermediate_size, config.vocab_size) == (INTER, VOCAB)
    assert config.max_position_embeddings == 128
    assert config.rope_theta == 50000.0
    assert config.norm_eps == pytest.approx(1e-6)
    assert config.tie_word_embeddings
    assert not config.attention_bias
    assert config.rope_scaling is None
    assert (config.bos_token_id, config.eos_token_ids) == (IM_START, (IM_END,))


def test_tiny_llama_weights_round_trip(tiny: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, weights = tiny
    checkpoint = load_checkpoint(path)  # dispatches .gguf here
    assert isinstance(checkpoint, Checkpoint)
    assert checkpoint.files == [path]
    assert checkpoint.config == read_gguf_config(path)
    assert set(checkpoint.tensors) == set(weights)  # tied: no lm_head.weight
    for name, expected in weights.items():
        got = checkpoint.tensors[name]
        assert got.dtype == torch.float32 and got.device.type == "cpu"
        # q/k were permuted by the writer as llama.cpp does; the loader must undo it exactly
        torch.testing.assert_close(got, torch.from_numpy(expected), rtol=0, atol=0, msg=name)


def test_tiny_untied_has_lm_head(tmp_path: Path) -> None:
    path = tmp_path / "untied.gguf"
    weights = write_tiny(path, tied=False)
    checkpoint = load_gguf(path)
    assert not checkpoint.config.tie_word_embeddings
    torch.testing.assert_close(
        checkpoint.tensors["lm_head.weight"], torch.from_numpy(weights["lm_head.weight"])
    )


def test_tiny_qwen2_keeps_rows_and_biases(tmp_path: Path) -> None:
    path = tmp_path / "qwen2.gguf"
    weights = write_tiny(path, "qwen2")
    checkpoint = load_gguf(path)
    assert checkpoint.config.arch == "qwen2" and checkpoint.config.attention_bias
    assert set(checkpoint.tensors) == set(weights)
    for name, expected in weights.items():  # qwen2 q/k are not permuted by llama.cpp
        torch.testing.assert_close(checkpoint.tensors[name], torch.from_numpy(expected), msg=name)


def test_tiny_rope_scaling(tmp_path: Path) -> None:
    path = tmp_path / "yarn.gguf"
    write_tiny(
        path,
        meta={
            "llama.rope.scaling.type": "yarn",
            "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 32,
        },
    )
    assert read_gguf_config(path).rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32,
    }


def test_wrong_shape_names_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    bad = np.zeros((KV_HEADS * HEAD_DIM + 1, HIDDEN), dtype=np.float32)
    write_tiny(path, tensors={"blk.1.attn_k.weight": bad})
    with pytest.raises(CheckpointError, match=r"blk\.1\.attn_k\.weight.*shape") as info:
        load_gguf(path)
    assert str(path) in str(info.value)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    path = tmp_path / "missing.gguf"
    write_tiny(path, tensors={"blk.0.ffn_up.weight": None})
    with pytest.raises(CheckpointError, match=r"missing tensors: blk\.0\.ffn_up\.weight"):
        load_gguf(path)


def test_unexpected_tensor_is_named(tmp_path: Path) -> None:
    path = tmp_path / "extra.gguf"
    write_tiny(path, tensors={"blk.0.ffn_gate_inp.weight": np.zeros((4, HIDDEN), np.float32)})
    with pytest.raises(CheckpointError, match=r"blk\.0\.ffn_gate_inp\.weight"):
        load_gguf(path)


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(path, "falcon")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for load in (read_gguf_config, load_gguf, load_checkpoint):
        with pytest.raises(UnsupportedArchitecture, match="'falcon' is not supported"):
            load(path)


@pytest.mark.parametrize("keep", [0, 3, 40, 2000, -1])
def test_truncated_tiny_file(tiny: tuple[Path, dict[str, np.ndarray]], keep: int) -> None:
    path, _ = tiny
    data = path.read_bytes()
    cut = path.with_name("cut.gguf")
    cut.write_bytes(data[:keep])
    with pytest.raises(CheckpointError) as info:
        load_gguf(cut)
    assert str(cut) in str(info.value)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "noise.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(10_000))
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        read_gguf_config(path)


# --- the real SmolLM2-135M-Instruct file -----------------------------------------------------


def test_smollm2_config(smollm2_path: Path) -> None:
    config = read_gguf_config(smollm2_path)
    assert config.arch == "llama"
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152
    assert config.tie_word_embeddings
    assert config.rope_theta == 100000.0
    assert config.max_position_embeddings == 8192
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))


def test_smollm2_truncated_copy(smollm2_path: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm2_path.open("rb") as src:
        cut.write_bytes(src.read(smollm2_path.stat().st_size // 2))  # ends mid-tensor data
    with pytest.raises(CheckpointError, match="truncated or corrupt") as info:
        load_gguf(cut)
    assert str(cut) in str(info.value)


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Checkpoint:
    return load_gguf(smollm2_path)


@pytest.fixture(scope="module")
def hf_model_state(smollm2_path: Path) -> Iterator[dict[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    )
    yield model.state_dict()


@pytest.mark.slow
def test_smollm2_weights_match_transformers(
    smollm2: Checkpoint, hf_model_state: dict[str, torch.Tensor]
) -> None:
    # transformers ties lm_head to embed_tokens and lists both; the tied copy is not a file tensor
    expected = {k: v for k, v in hf_model_state.items() if k != "lm_head.weight"}
    assert set(smollm2.tensors) == set(expected)
    for name, want in expected.items():
        got = smollm2.tensors[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        # Both dequantize the same blocks, so they agree bit for bit today; allow float rounding
        # (a different dequantizer), nothing more. torch.equal is the fast path on 135M values.
        if not torch.equal(got, want):
            diff = (got - want).abs().max().item()
            assert diff <= 1e-6, f"{name}: max abs diff {diff}"
