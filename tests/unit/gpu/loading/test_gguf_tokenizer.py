"""gpu.loading.gguf_tokenizer: tiny GGUFs (test_gguf's writer); the real SmolLM2 vs
transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu.errors import CheckpointError
from gpu.loading.gguf import load_gguf
from gpu.loading.tokenizer import Tokenizer
from tests.unit.gpu.loading.test_gguf import IM_END, IM_START, THINK, TOKENS, VOCAB, write_tiny

# --- tiny synthetic GGUFs -------------------------------------------------------------------


def test_tiny_tokenizer_special_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny(path)
    tokenizer = load_gguf(path).tokenizer
    hello = TOKENS.index("hello")
    ids = tokenizer.encode("<|im_start|>hello<think><|im_end|>")
    assert ids == [IM_START, hello, THINK, IM_END]  # matched whole, never split
    assert tokenizer.decode(ids) == "hello<think>"  # control hidden, user-defined kept
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>hello<think><|im_end|>"
    assert tokenizer.encode(" hello 12") == [
        TOKENS.index("Ġ"),
        hello,
        TOKENS.index("Ġ"),
        TOKENS.index("1"),
        TOKENS.index("2"),
    ]
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tokenizer.eos_token_ids == (IM_END,)
    assert tokenizer.vocab_size == VOCAB  # specials reuse their ids, nothing appended
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>hi<|im_end|>"
    )


def test_tiny_add_bos_token(tmp_path: Path) -> None:
    path = tmp_path / "bos.gguf"
    write_tiny(path, meta={"tokenizer.ggml.add_bos_token": True})
    tokenizer = load_gguf(path).tokenizer
    assert tokenizer.encode("hello") == [IM_START, TOKENS.index("hello")]
    assert tokenizer.encode("hello", add_special_tokens=False) == [TOKENS.index("hello")]


def test_unsupported_tokenizer_model(tmp_path: Path) -> None:
    path = tmp_path / "spm.gguf"
    write_tiny(path, meta={"tokenizer.ggml.model": "llama"})
    with pytest.raises(CheckpointError, match="tokenizer model 'llama' is not supported"):
        load_gguf(path)


def test_unknown_pre_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "pre.gguf"
    write_tiny(path, meta={"tokenizer.ggml.pre": "something-new"})
    with pytest.raises(CheckpointError, match="pre-tokenizer 'something-new'"):
        load_gguf(path)


# --- the real SmolLM2-135M-Instruct file -----------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path: Path) -> Tokenizer:
    return load_gguf(smollm2_path).tokenizer


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)


# Text where SmolLM2's pre-tokenizer split is irrelevant or agrees everywhere.
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "12345",
    "3.14159 and 2,718 and 1e-9",
    "I'm sure you'll see it's fine, they've said.",
    "héllo wörld — naïve café",
    "日本語のテキスト、Привет мир, مرحبا",
    "I ❤️ 🤖🚀! 👩‍👩‍👧",
    "def f(x):\n    return x ** 2  # square\n",
    "\tindented\n\n  spaces   here ",
    " leading space",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "a<|im_end|>b<repo_name>c",
    "",
]
# Whitespace runs before digits: llama.cpp's `smollm` pre-tokenizer (and SmolLM2's original
# tokenizer.json: Digits then ByteLevel) split the digit off first, so "  1" is ["ĠĠ", "1"].
# transformers' GGUF tokenizer has no entry for `smollm` and uses the plain GPT-2 regex, which
# gives ["Ġ", "Ġ", "1"]. We follow llama.cpp and the model's own tokenizer.
DIGIT_AFTER_SPACES = ["x  1", "  1  22   333", "a\n  12", "total:    42"]


def _original_smollm2_tokenizer(hf_tokenizer: Any) -> Any:
    from tokenizers import Tokenizer, pre_tokenizers

    backend = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return backend


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers(
    smollm2_tokenizer: Tokenizer, hf_tokenizer: Any
) -> None:
    ours = smollm2_tokenizer
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == hf_tokenizer.encode(text), text
        assert ours.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True), text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.encode("<|im_start|>") == [1]
    assert ours.encode("12345") == [33, 34, 35, 36, 37]  # SmolLM2 has single-digit tokens only


@pytest.mark.slow
def test_smollm2_tokenizer_splits_digits_like_llama_cpp(
    smollm2_tokenizer: Tokenizer, hf_tokenizer: Any
) -> None:
    original = _original_smollm2_tokenizer(hf_tokenizer)
    for text in TEXTS + DIGIT_AFTER_SPACES:
        assert smollm2_tokenizer.encode(text) == original.encode(text).ids, text
    assert smollm2_tokenizer.encode("x  1") == [104, 256, 33]  # "x", "ĠĠ", "1"


@pytest.mark.slow
def test_smollm2_chat_template_matches_transformers(
    smollm2_tokenizer: Tokenizer, hf_tokenizer: Any
) -> None:
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
    ]
    for messages in conversations:
        for add_generation_prompt in (True, False):
            want = hf_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            got = smollm2_tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt
            )
            assert got == want
    assert smollm2_tokenizer.eos_token == "<|im_end|>"
    assert smollm2_tokenizer.eos_token_ids == (2,)
