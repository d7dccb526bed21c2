"""Rebuilding a GGUF file's tokenizer from its `tokenizer.ggml.*` metadata.

llama.cpp stores a byte-level BPE vocabulary as token strings, token types and merges, plus a
pre-tokenizer name (`tokenizer.ggml.pre`), BOS/EOS ids and a chat template. This module turns
them into a Hugging Face `tokenizers.Tokenizer` that splits text as llama.cpp does, wrapped in
our `Tokenizer`; `gpu.loading.gguf` calls it with the file's metadata. A SentencePiece
vocabulary (`tokenizer.ggml.model = "llama"`, Gemma's) is built by `gpu.loading.gguf_sentencepiece`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from gpu.errors import CheckpointError
from gpu.loading.gguf_sentencepiece import SENTENCEPIECE_ARCHITECTURES, gemma_tokenizer
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import ModelConfig

# llama.cpp token types (tokenizer.ggml.token_type)
_CONTROL = 3
_USER_DEFINED = 4

_DIGITS = r"\p{N}"  # isolate every digit, then the GPT-2 regex (StarCoder family)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre → (split regex, ignore_merges), grouped as in llama.cpp's llama-vocab.cpp;
# None: ByteLevel's built-in GPT-2 regex alone.
_PRE_TOKENIZERS: dict[str, tuple[str | None, bool]] = {
    **dict.fromkeys(("default", "gpt-2", "gpt2", "mpt", "olmo", "jais"), (None, False)),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        (_DIGITS, False),
    ),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3"), (_LLAMA3_SPLIT, True)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), (_QWEN2_SPLIT, False)),
}


class GGUFMetadata(Protocol):
    """The GGUF metadata access this module needs; `gpu.loading.gguf` passes one in.

    A Protocol, so this module does not import the loader that imports it.
    """

    @property
    def path(self) -> Path: ...

    def get(self, key: str, default: Any = None) -> Any: ...

    def require(self, key: str) -> Any: ...  # raises CheckpointError naming a missing key


def build_gguf_tokenizer(meta: GGUFMetadata, config: ModelConfig) -> Tokenizer:
    """The tokenizer described by `tokenizer.ggml.*`: byte-level BPE run as llama.cpp runs it,
    or Gemma's SentencePiece vocabulary as transformers rebuilds it (`gguf_sentencepiece`)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama" and config.arch in SENTENCEPIECE_ARCHITECTURES:
        return _sentencepiece(meta, config)
    if kind != "gpt2":
        raise CheckpointError(
            meta.path,
            f"GGUF tokenizer model {kind!r} is not supported for {config.arch} (supported: "
            f"byte-level BPE, 'gpt2'; SentencePiece, 'llama', for "
            f"{', '.join(SENTENCEPIECE_ARCHITECTURES)}); use the Hugging Face checkpoint folder",
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise CheckpointError(
            meta.path,
            f"GGUF pre-tokenizer {pre!r} is not supported "
            f"(supported: {', '.join(sorted(_PRE_TOKENIZERS))})",
        )
    split, ignore_merges = _PRE_TOKENIZERS[pre]
    tokens: list[str] = list(meta.require("tokenizer.ggml.tokens"))
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    if len(types) != len(tokens) or any(len(m) != 2 for m in merges):
        raise CheckpointError(meta.path, "tokenizer metadata is inconsistent")
    try:
        inner = HFTokenizer(
            models.BPE(
                vocab=_byte_level_vocab(tokens, types),
                merges=merges,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                ignore_merges=ignore_merges,
            )
        )
    except Exception as exc:  # tokenizers raises a bare Exception on bad vocab/merges
        raise CheckpointError(meta.path, f"cannot build the GGUF tokenizer: {exc}") from exc
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    inner.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            # After the digit split, GPT-2's regex still runs (ByteLevel's built-in one).
            pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=split == _DIGITS),
        ]
        if split is not None
        else [pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=True)]
    )
    inner.decoder = decoders.ByteLevel()
    # llama.cpp matches control and user-defined tokens whole; only control ones are hidden on
    # decode (user-defined ones such as `<think>` are text the model writes).
    inner.add_special_tokens(_added(tokens, types, _CONTROL, special=True))
    inner.add_tokens(_added(tokens, types, _USER_DEFINED, special=False))

    # llama.cpp's defaults when the file is silent: BOS for the llama3 family only.
    return _wrap(inner, meta, config, tokens, add_bos_default=split == _LLAMA3_SPLIT)


def _sentencepiece(meta: GGUFMetadata, config: ModelConfig) -> Tokenizer:
    tokens: list[str] = list(meta.require("tokenizer.ggml.tokens"))
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(types) != len(tokens):
        raise CheckpointError(meta.path, "tokenizer metadata is inconsistent")
    unk = _token_text(tokens, meta.get("tokenizer.ggml.unknown_token_id"))
    try:
        inner = gemma_tokenizer(tokens, types, unk)
    except Exception as exc:  # tokenizers raises a bare Exception on bad vocab/merges
        raise CheckpointError(meta.path, f"cannot build the GGUF tokenizer: {exc}") from exc
    # SentencePiece vocabularies get BOS unless the file says otherwise (llama.cpp, transformers).
    return _wrap(inner, meta, config, tokens, add_bos_default=True)


def _wrap(
    inner: HFTokenizer,
    meta: GGUFMetadata,
    config: ModelConfig,
    tokens: list[str],
    *,
    add_bos_default: bool,
) -> Tokenizer:
    """BOS/EOS as the file asks for them, its chat template, and the model's stop ids."""
    bos_id, eos_id = config.bos_token_id, meta.get("tokenizer.ggml.eos_token_id")
    bos, eos = _token_text(tokens, bos_id), _token_text(tokens, eos_id)
    add_bos = meta.get("tokenizer.ggml.add_bos_token", add_bos_default)
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
    template = _post_processor(bos if add_bos else None, bos_id, eos if add_eos else None, eos_id)
    if template is not None:
        inner.post_processor = template
    chat_template = meta.get("tokenizer.chat_template")
    return Tokenizer(
        inner,
        eos_token_ids=config.eos_token_ids,
        bos_token=bos,
        eos_token=eos,
        chat_template=chat_template if isinstance(chat_template, str) else None,
    )


def _byte_level_vocab(tokens: list[str], types: list[int]) -> dict[str, int]:
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for index, (token, token_type) in enumerate(zip(tokens, types, strict=True)):
        if token_type not in (_CONTROL, _USER_DEFINED) and not set(token) <= alphabet:
            # A normal token stored as raw text: BPE only ever sees the byte alphabet.
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    return vocab


def _added(tokens: list[str], types: list[int], wanted: int, *, special: bool) -> list[AddedToken]:
    return [
        AddedToken(token, special=special, normalized=False)
        for token, token_type in zip(tokens, types, strict=True)
        if token_type == wanted and token
    ]


def _token_text(tokens: list[str], token_id: Any) -> str | None:
    if token_id is None or not 0 <= int(token_id) < len(tokens):
        return None
    return tokens[int(token_id)]


def _post_processor(
    bos: str | None, bos_id: Any, eos: str | None, eos_id: Any
) -> processors.TemplateProcessing | None:
    """BOS/EOS added around each sequence when the file asks for them (`add_bos_token`)."""
    if bos is None and eos is None:
        return None

    def sequence(piece: str, type_id: int) -> str:
        parts = [f"{bos}:{type_id}"] if bos else []
        parts.append(f"${piece}:{type_id}")
        parts += [f"{eos}:{type_id}"] if eos else []
        return " ".join(parts)

    specials = {t: int(i) for t, i in ((bos, bos_id), (eos, eos_id)) if t is not None}
    return processors.TemplateProcessing(
        single=sequence("A", 0),
        pair=f"{sequence('A', 0)} {sequence('B', 1)}",
        special_tokens=list(specials.items()),
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (byte-level BPE's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping
