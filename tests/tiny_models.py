"""Random-weight tiny checkpoints built with transformers, saved as HF safetensors folders.

Each architecture the engine implements gets one, so the engine can be compared with
transformers token for token. The tokenizer is a small byte-level BPE trained on the spot.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = "<|endoftext|>"
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Kafka topics carry generation jobs; the worker answers each one exactly once.",
    "def add(a, b):\n    return a + b\n",
    "1234567890 + 42 = 1234567932",
    "Paged attention keeps the KV cache in fixed-size blocks.",
] * 20

# llama_scaled: llama3 RoPE scaling and Llama's attention_bias (q/k/v and o_proj biases).
# gemma2/gemma3: sliding windows of 12 and 10 positions, far shorter than the test prompts.
ARCHS = ("llama", "llama_tied", "llama_scaled", "qwen2", "mistral", "gpt2", "gemma2", "gemma3")
# qwen3: q/k norms and a head_dim apart from hidden / heads; phi3: fused weights and LongRoPE
# switching at 48 positions; mixtral, qwen3_moe: 4 experts, top 2 (renormalised, and not).
ARCHS += ("qwen3", "phi3", "mixtral", "qwen3_moe")
LONGROPE_ORIGINAL = 48  # phi3's original_max_position_embeddings
# Tested apart from ARCHS (a smaller matrix): Phi-4-mini's partial rotary with a tied head;
# Qwen3-MoE with a dense layer among the sparse ones (mlp_only_layers); Mistral-7B-v0.1's
# sliding window (16 positions here), which the Llama layers apply.
EXTRA_ARCHS = ("phi3_partial", "qwen3_moe_dense", "mistral_window")


def train_tokenizer(vocab_size: int = 320) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def hf_config(arch: str, vocab_size: int, eos: int):  # type: ignore[no-untyped-def]
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=vocab_size, bos_token_id=eos, eos_token_id=eos, initializer_range=0.1)
    llama_like = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        **common,
    )
    if arch == "llama":
        return LlamaConfig(tie_word_embeddings=False, rope_theta=10000.0, **llama_like)
    if arch == "llama_tied":
        return LlamaConfig(tie_word_embeddings=True, rope_theta=500000.0, **llama_like)
    if arch == "llama_scaled":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return LlamaConfig(
            tie_word_embeddings=False, attention_bias=True, rope_parameters=rope, **llama_like
        )
    if arch == "qwen2":
        return Qwen2Config(tie_word_embeddings=False, rope_theta=1000000.0, **llama_like)
    if arch == "mistral":
        return MistralConfig(tie_word_embeddings=False, sliding_window=None, **llama_like)
    if arch == "mistral_window":  # Mistral-7B-v0.1's sliding window, far shorter than the prompts
        return MistralConfig(tie_word_embeddings=False, sliding_window=16, **llama_like)
    if arch == "gpt2":
        return GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=512, **common)
    if arch in ("gemma2", "gemma3", "gemma3_local"):
        return gemma_config(arch, common)
    if arch in ("qwen3", "phi3", "mixtral", "qwen3_moe", "phi3_partial", "qwen3_moe_dense"):
        return newer_llama_config(arch, llama_like)
    raise ValueError(arch)


def newer_llama_config(arch: str, llama_like: dict):  # type: ignore[no-untyped-def, type-arg]
    from transformers import MixtralConfig, Phi3Config, Qwen3Config, Qwen3MoeConfig

    if arch == "qwen3":
        return Qwen3Config(tie_word_embeddings=False, head_dim=32, **llama_like)
    if arch in ("phi3", "phi3_partial"):  # phi3_partial: Phi-4-mini's partial rotary, tied
        partial = 0.5 if arch == "phi3_partial" else 1.0
        half = int(16 * partial) // 2  # head_dim 16: one factor per rotated pair
        rope = {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.05 * i for i in range(half)],
            "long_factor": [1.0 + 0.9 * i for i in range(half)],
            "original_max_position_embeddings": LONGROPE_ORIGINAL,
            "partial_rotary_factor": partial,
        }
        return Phi3Config(
            tie_word_embeddings=arch == "phi3_partial",
            partial_rotary_factor=partial,
            pad_token_id=None,
            original_max_position_embeddings=LONGROPE_ORIGINAL,
            rope_parameters=rope,
            **llama_like,
        )
    experts = dict(llama_like, intermediate_size=32)
    if arch == "mixtral":
        return MixtralConfig(
            num_local_experts=4, num_experts_per_tok=2, sliding_window=None, **experts
        )
    dense = arch == "qwen3_moe_dense"  # layer 1's MLP dense, 128 wide
    return Qwen3MoeConfig(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=dense,
        head_dim=32,
        mlp_only_layers=[1] if dense else [],
        **(llama_like if dense else experts),
    )


def gemma_config(arch: str, common: dict):  # type: ignore[no-untyped-def, type-arg]
    from transformers import Gemma2Config, Gemma3TextConfig

    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        **common,
    )
    if arch == "gemma2":  # layers alternate sliding, full; soft caps low enough to bite
        return Gemma2Config(
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=12,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=10.0,
            **shape,
        )
    rope = {
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    types = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    if arch == "gemma3_local":  # every layer local: blocks behind the window are released
        types = ["sliding_attention"] * 4
    return Gemma3TextConfig(
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=32,
        sliding_window=10,
        layer_types=types,
        rope_parameters=rope,
        **shape,
    )


def build_tiny_checkpoint(arch: str, folder: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    tok = train_tokenizer()
    eos = tok.token_to_id(SPECIAL)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(arch, tok.get_vocab_size(), eos))
    if arch.startswith("qwen3"):  # q/k norms start at 1: make a misplaced one show
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.uniform_(0.5, 1.5)
    if arch.startswith("gemma"):  # Gemma's norms start at 0 (a scale of 1 + 0): make them count
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.normal_(0.0, 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": SPECIAL, "bos_token": SPECIAL})
    )
    return folder


# A real model's config.json at a tiny size: random-weight models (`--random-weights`) with the
# same architecture and rope settings, small enough for a CPU test.
TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=512,
    bos_token_id=0,
    eos_token_id=1,
)


def tiny_config(source: Path, target: Path, **changes: object) -> Path:
    """`source` (an HF config.json) with TINY_SHAPE and `changes`, written to `target`."""
    raw = json.loads(source.read_text())
    raw.update(TINY_SHAPE, **changes)
    target.write_text(json.dumps(raw))
    return target
