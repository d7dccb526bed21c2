"""A GGUF file's SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`) as a BPE tokenizer.

llama.cpp stores a SentencePiece model as its pieces, scores and token types, with `<0xNN>`
pieces for byte fallback and, for Gemma, no merges. This rebuilds the tokenizer transformers
builds from the same file (`integrations/gguf/gguf_tokenizer_mapping.py`, `gemma_tokenizer` and
`GemmaTokenizer`), so both split every text alike: BPE with byte fallback over the pieces, the
merges derived from the vocabulary, spaces spelled `▁` by the normalizer, no prefix space.

Only Gemma's vocabulary is built here (architectures in `SENTENCEPIECE_ARCHITECTURES`); other
SentencePiece families differ in normalizer and pre-tokenizer and are refused by the caller.
"""

from __future__ import annotations

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

SENTENCEPIECE_ARCHITECTURES = ("gemma3",)
_SPACE = "\u2581"  # SentencePiece's visible space
# llama.cpp token types (tokenizer.ggml.token_type)
_CONTROL = 3
_USER_DEFINED = 4


def gemma_tokenizer(tokens: list[str], types: list[int], unk: str | None) -> HFTokenizer:
    """Gemma's pieces → BPE; special and user-defined tokens added, as transformers adds them.

    Raises whatever `tokenizers` raises on a vocabulary it cannot build (a bare Exception).
    """
    # Pieces of two or more spaces are stored as spaces, but looked up as `▁▁…`.
    pieces = [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {piece: index for index, piece in enumerate(pieces)}  # a repeat keeps its last id
    # Gemma's scores do not follow its merge order; the pieces' order in the file does.
    rank = {piece: -index for index, piece in enumerate(pieces)}
    inner = HFTokenizer(
        models.BPE(
            vocab=vocab,
            merges=_merges(vocab, rank),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    inner.normalizer = normalizers.Replace(" ", _SPACE)
    inner.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    inner.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # As transformers: control tokens are special; user-defined ones are plain added tokens,
    # matched whole, where their spelling is in the vocabulary as the file has it.
    inner.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, types, strict=True)
            if kind == _CONTROL
        ]
    )
    inner.add_tokens(
        [
            AddedToken(token, special=False, normalized=False)
            for token, kind in zip(tokens, types, strict=True)
            if kind == _USER_DEFINED and token in vocab
        ]
    )
    return inner


def _merges(vocab: dict[str, int], rank: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces, best-ranked piece first.

    transformers' `generate_merges` with scores: within a piece, splits by their halves' ids;
    across pieces, by rank, then by the halves' lengths, longest first (a stable sort).
    """
    found: list[tuple[str, str, int]] = []
    for piece, score in rank.items():
        local = [
            (piece[:cut], piece[cut:], score)
            for cut in range(1, len(piece))
            if piece[:cut] in vocab and piece[cut:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]
