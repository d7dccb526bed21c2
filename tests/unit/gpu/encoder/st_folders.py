"""Tiny sentence-transformers folders written on the spot: the pipeline files alone (for the
parser), or a whole embedding model (a random-weight `Gemma3TextModel` with bidirectional
attention, a BPE tokenizer adding <bos> … <eos>, pooling, two Dense layers, Normalize) that
sentence-transformers itself loads, as the reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tests.tiny_models import CORPUS

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"  # ids 0, 1, 2 as Gemma's
PROMPTS = {"query": "task: search | query: ", "document": "title: none | text: ", "empty": None}
WINDOW = 8  # the tiny model's sliding window: 4 positions each side
MAX_SEQ_LENGTH = 40  # sentence_bert_config.json's: texts longer than this are truncated


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1))


def module(idx: int, kind: str, path: str) -> dict[str, Any]:
    return {
        "idx": idx,
        "name": str(idx),
        "path": path,
        "type": f"sentence_transformers.models.{kind}",
    }


def write_dense(
    folder: Path, in_features: int, out_features: int, *, bias: bool, activation: str, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    tensors = {"linear.weight": torch.randn(out_features, in_features, generator=generator) * 0.3}
    if bias:
        tensors["linear.bias"] = torch.randn(out_features, generator=generator) * 0.1
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"in_features": in_features, "out_features": out_features, "bias": bias}
    if activation:
        config["activation_function"] = activation
    write_json(folder / "config.json", config)


def write_pipeline(
    folder: Path,
    hidden: int = 64,
    *,
    pooling: dict[str, Any] | None = None,
    dense: bool = True,
    normalize: bool = True,
    prompts: dict[str, Any] | None = None,
    default_prompt_name: str | None = None,
    max_seq_length: int | None = MAX_SEQ_LENGTH,
) -> Path:
    """The pipeline's files: modules.json, 1_Pooling, 2_Dense (tanh, bias), 3_Dense
    (identity), 4_Normalize (no folder), the prompts and sentence_bert_config.json; the
    transformer's config.json only where none is there yet."""
    if not (folder / "config.json").exists():
        write_json(folder / "config.json", {"hidden_size": hidden})
    modules = [module(0, "Transformer", ""), module(1, "Pooling", "1_Pooling")]
    pooling = pooling if pooling is not None else {"pooling_mode_mean_tokens": True}
    write_json(
        folder / "1_Pooling" / "config.json", {"word_embedding_dimension": hidden, **pooling}
    )
    if dense:
        tanh, identity = "torch.nn.modules.activation.Tanh", "torch.nn.modules.linear.Identity"
        write_dense(folder / "2_Dense", hidden, 96, bias=True, activation=tanh, seed=1)
        write_dense(folder / "3_Dense", 96, 48, bias=False, activation=identity, seed=2)
        modules += [module(2, "Dense", "2_Dense"), module(3, "Dense", "3_Dense")]
    if normalize:
        modules.append(module(len(modules), "Normalize", f"{len(modules)}_Normalize"))
    write_json(folder / "modules.json", modules)
    write_json(
        folder / "config_sentence_transformers.json",
        {
            "prompts": PROMPTS if prompts is None else prompts,
            "default_prompt_name": default_prompt_name,
        },
    )
    settings = {"do_lower_case": False}
    if max_seq_length is not None:
        settings["max_seq_length"] = max_seq_length
    write_json(folder / "sentence_bert_config.json", settings)
    return folder


def gemma_tokenizer() -> Tokenizer:
    """A small byte-level BPE with Gemma's special ids, adding <bos> … <eos> as Gemma's does."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[PAD, EOS, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, 2), (EOS, 1)]
    )
    return tok


def write_embedding_model(folder: Path, seed: int = 0, **pipeline: Any) -> Path:
    """A whole tiny embedding model (see the module doc) in `folder`."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    tok = gemma_tokenizer()
    config = Gemma3TextConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        max_position_embeddings=512,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        use_bidirectional_attention=True,
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(seed)
    model = Gemma3TextModel(config)
    with torch.no_grad():  # Gemma's norms start at 0 (a scale of 1 + 0): make them count
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "model_max_length": 512,
            "padding_side": "right",
        },
    )
    return write_pipeline(folder, 64, **pipeline)
