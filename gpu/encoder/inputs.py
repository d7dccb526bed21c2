"""An embedding input's tokens, as sentence-transformers makes them.

`embed_tokens`: the task prompt's text put before the input's, the whole tokenized with the
tokenizer's special tokens (EmbeddingGemma: `<bos> … <eos>`). `fit`: an input longer than
the model takes, cut as its tokenizer's truncation cuts it: the special tokens at either end
stay, the text's tokens between them are cut ("end": the first ones kept, sentence-transformers'
way; "start": the last ones).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu.encoder.spec import EmbeddingSpec
from gpu.errors import UnknownPromptName
from gpu.loading.tokenizer import Tokenizer

TRUNCATIONS = ("none", "end", "start")


def prompt_text(spec: EmbeddingSpec, prompt_name: str | None) -> str:
    """The task prompt `prompt_name` names (None: the model's default, if any; else none).
    Raises `UnknownPromptName` (a KeyError) for a name the model does not have."""
    if prompt_name is None:
        prompt_name = spec.default_prompt_name
        if prompt_name is None:
            return ""
    try:
        return spec.prompts[prompt_name]
    except KeyError:
        raise UnknownPromptName(prompt_name, spec.prompts) from None


def embed_tokens(
    tokenizer: Tokenizer, spec: EmbeddingSpec, text: str, prompt_name: str | None
) -> list[int]:
    """`text`'s tokens with its task prompt, special tokens included, not truncated (`fit`)."""
    return tokenizer.encode(prompt_text(spec, prompt_name) + text, add_special_tokens=True)


def fit(
    tokens: Sequence[int],
    max_tokens: int,
    truncate: str,
    specials: tuple[int, int] = (1, 1),
) -> tuple[list[int], bool]:
    """`tokens` within `max_tokens`, and whether they were cut.

    `truncate`: "none" returns them unchanged (the caller refuses an input too long); "end"
    keeps the first text tokens, "start" the last. `specials`: how many of `tokens` at the
    start and at the end are special tokens the tokenizer added (kept whatever is cut):
    `EmbeddingSpec.specials` for a text from `embed_tokens`; (0, 0) for token ids run as given.
    """
    if truncate not in TRUNCATIONS:
        raise ValueError(f"truncate must be one of {TRUNCATIONS}, got {truncate!r}")
    tokens = list(tokens)
    if len(tokens) <= max_tokens or truncate == "none":
        return tokens, False
    head, tail = specials
    if head + tail > len(tokens):  # fewer tokens than the specials said: none to keep apart
        head = tail = 0
    body = tokens[head : len(tokens) - tail]
    keep = max(0, max_tokens - head - tail)
    kept = body[:keep] if truncate == "end" else body[len(body) - keep :]
    return tokens[:head] + kept + tokens[len(tokens) - tail :], True


def special_counts(tokenizer: Tokenizer) -> tuple[int, int]:
    """How many special tokens `tokenizer` puts before and after a text
    (`EmbeddingSpec.specials`)."""
    probe = "a"
    bare = tokenizer.encode(probe, add_special_tokens=False)
    full = tokenizer.encode(probe, add_special_tokens=True)
    for head in range(len(full) - len(bare) + 1):
        if full[head : head + len(bare)] == bare:
            return head, len(full) - head - len(bare)
    return 0, 0
