"""gpu.loading.gguf for arch gemma3: a tiny file written here (fast); the real Gemma 3 270M file
against transformers reading the same file (slow)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import gpu.loading.gguf_tensors
from gpu.errors import CheckpointError
from gpu.loading.gguf import load_gguf, read_gguf_config
from gpu.loading.gguf_quants import dequantize
from gpu.loading.gguf_tensors import GGUFTensors
from gpu.model_config import FULL, SLIDING

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, WINDOW = 7, 16, 2, 1, 8, 24, 4
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
PIECES = ["\u2581", "h", "e", "l", "o", "he", "ll", "hell", "hello", "\u2581hello", "  "]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
TOKENS = [*SPECIALS, *BYTES, *PIECES]
# llama.cpp token types: 1 normal, 2 unknown, 3 control, 6 byte
TYPES = [3, 3, 3, 2, 3, *[6] * 256, *[1] * len(PIECES)]

# HF name → GGUF name within a layer (Gemma 3's four norms, and one per q and k head)
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _hf_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {
        "input_layernorm.weight": (HIDDEN,),
        "self_attn.q_proj.weight": (q, HIDDEN),
        "self_attn.k_proj.weight": (kv, HIDDEN),
        "self_attn.v_proj.weight": (kv, HIDDEN),
        "self_attn.o_proj.weight": (HIDDEN, q),
        "self_attn.q_norm.weight": (HEAD_DIM,),
        "self_attn.k_norm.weight": (HEAD_DIM,),
        "post_attention_layernorm.weight": (HIDDEN,),
        "pre_feedforward_layernorm.weight": (HIDDEN,),
        "post_feedforward_layernorm.weight": (HIDDEN,),
        "mlp.gate_proj.weight": (INTER, HIDDEN),
        "mlp.up_proj.weight": (INTER, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, INTER),
    }
    weights = {
        "model.embed_tokens.weight": rng.standard_normal((len(TOKENS), HIDDEN)),
        "model.norm.weight": rng.standard_normal(HIDDEN),
    }
    for i in range(LAYERS):
        for name, shape in shapes.items():
            weights[f"model.layers.{i}.{name}"] = rng.standard_normal(shape)
    return {k: v.astype(np.float32) for k, v in weights.items()}


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_LAYER[rest]}"


def write_tiny_gemma3(path: Path, *, drop: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """A tiny gemma3 GGUF as llama.cpp writes one (norms stored as 1 + w); its HF weights.

    `drop`: GGUF tensor names left out of the file.
    """
    weights = _hf_weights()
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(WINDOW)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(TOKENS))
    writer.add_token_types(TYPES)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    for hf, w in weights.items():
        name = _gguf_name(hf)
        if name not in drop:
            writer.add_tensor(name, w + 1.0 if name.endswith("norm.weight") else w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "tiny-gemma3.gguf"
    return path, write_tiny_gemma3(path)


def test_tiny_gemma3_config(tiny: tuple[Path, dict[str, np.ndarray]]) -> None:
    config = read_gguf_config(tiny[0])
    assert config.arch == "gemma3"
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (
        LAYERS,
        HIDDEN,
        INTER,
    )
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (HEADS, KV_HEADS, HEAD_DIM)
    assert config.vocab_size == len(TOKENS) and config.tie_word_embeddings
    assert config.max_position_embeddings == 64 and config.sliding_window == WINDOW
    # Not in the file: transformers' Gemma3TextConfig defaults, as when it reads the file.
    assert config.layer_types == (*[SLIDING] * 5, FULL, SLIDING)
    assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert config.query_pre_attn_scalar == 256 and config.qk_norm
    assert config.attn_logit_softcapping is None and config.final_logit_softcapping is None
    assert config.activation == "gelu_pytorch_tanh"
    assert (config.bos_token_id, config.eos_token_ids) == (2, (1,))


def test_tiny_gemma3_tensors_under_hf_names_with_norms_shifted_back(
    tiny: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, weights = tiny
    checkpoint = load_gguf(path)
    assert set(checkpoint.tensors) == set(weights)
    for name, want in weights.items():
        got = checkpoint.tensors[name]
        assert got.dtype == torch.float32, name
        # norms: written as 1 + w, read back as w (a float32 round trip through + 1 and - 1)
        torch.testing.assert_close(got, torch.from_numpy(want), rtol=0, atol=1e-6, msg=name)


def test_tensors_are_dequantized_when_read_not_when_loaded(
    tiny: tuple[Path, dict[str, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = dequantize  # what gguf_tensors calls, patched below

    def counting(data: np.ndarray, *args: object) -> torch.Tensor:
        calls.append(str(args[1]))
        return real(data, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu.loading.gguf_tensors, "dequantize", counting)
    checkpoint = load_gguf(tiny[0], dtype=torch.bfloat16)
    assert isinstance(checkpoint.tensors, GGUFTensors) and calls == []
    assert "model.norm.weight" in checkpoint.tensors and calls == []  # membership reads no data
    embed = checkpoint.tensors["model.embed_tokens.weight"]
    assert embed.dtype == torch.bfloat16 and len(calls) == 1
    want = torch.from_numpy(tiny[1]["model.embed_tokens.weight"]).to(torch.bfloat16)
    assert torch.equal(embed, want)
    assert checkpoint.tensors["model.layers.0.input_layernorm.weight"].dtype == torch.bfloat16


def test_tiny_gemma3_tokenizer(tiny: tuple[Path, dict[str, np.ndarray]]) -> None:
    tokenizer = load_gguf(tiny[0]).tokenizer
    ids = tokenizer.encode("hello hello")
    assert ids[0] == 2  # add_bos_token
    assert [TOKENS[i] for i in ids[1:]] == ["hello", "\u2581hello"]
    assert tokenizer.decode(ids) == "hello hello"
    # byte fallback: a character with no piece becomes its UTF-8 bytes, and decodes back
    ids = tokenizer.encode("hé", add_special_tokens=False)
    assert [TOKENS[i] for i in ids] == ["h", "<0xC3>", "<0xA9>"]
    assert tokenizer.decode(ids) == "hé"
    # a run of spaces is the `▁▁` piece (stored as real spaces in the file)
    ids = tokenizer.encode("h  h", add_special_tokens=False)
    assert [TOKENS[i] for i in ids] == ["h", "  ", "h"]
    # control tokens are matched whole and hidden on decode
    ids = tokenizer.encode("<start_of_turn>hello", add_special_tokens=False)
    assert ids == [4, TOKENS.index("hello")]
    assert tokenizer.decode(ids) == "hello"


def test_gemma3_missing_q_norm_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_tiny_gemma3(path, drop=("blk.0.attn_q_norm.weight",))
    with pytest.raises(CheckpointError, match=r"missing tensors: blk\.0\.attn_q_norm\.weight"):
        load_gguf(path)


# --- the real Gemma 3 270M file, against transformers reading it ------------------------------


@pytest.fixture(scope="module")
def hf_gemma3(gemma3_path: Path) -> Iterator[torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(gemma3_path.parent), gguf_file=gemma3_path.name, dtype=torch.float32
    )
    yield model


@pytest.mark.slow
def test_gemma3_270m_config_matches_transformers(gemma3_path: Path) -> None:
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(gemma3_path.parent), gguf_file=gemma3_path.name)
    config = read_gguf_config(gemma3_path)
    assert hf.model_type == "gemma3_text"
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (18, 640, 2048)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 1, 256)
    assert config.vocab_size == hf.vocab_size == 262_144
    assert config.num_layers == hf.num_hidden_layers
    assert config.hidden_size == hf.hidden_size
    assert config.intermediate_size == hf.intermediate_size
    assert (config.num_heads, config.num_kv_heads) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
    )
    assert config.head_dim == hf.head_dim
    assert config.max_position_embeddings == hf.max_position_embeddings == 32_768
    assert config.norm_eps == hf.rms_norm_eps
    assert config.sliding_window == hf.sliding_window == 512
    assert list(config.layer_types or ()) == hf.layer_types
    assert config.rope_theta == hf.rope_parameters[FULL]["rope_theta"] == 1_000_000.0
    assert config.rope_local_theta == hf.rope_parameters[SLIDING]["rope_theta"] == 10_000.0
    assert config.query_pre_attn_scalar == hf.query_pre_attn_scalar
    assert config.final_logit_softcapping == hf.final_logit_softcapping
    assert config.activation == hf.hidden_activation
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    assert config.bos_token_id == hf.bos_token_id


@pytest.mark.slow
def test_gemma3_270m_weights_match_transformers(
    gemma3_path: Path, hf_gemma3: torch.nn.Module
) -> None:
    state = {k: v for k, v in hf_gemma3.state_dict().items() if k != "lm_head.weight"}
    tensors = load_gguf(gemma3_path).tensors
    assert set(tensors) == set(state)
    for name, want in state.items():
        got = tensors[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert torch.equal(got, want), f"{name}: max abs diff {(got - want).abs().max()}"
