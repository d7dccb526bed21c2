"""The model's tokenizer: a `tokenizers.Tokenizer` plus the special ids and chat template.

Built from an HF folder (`tokenizer.json`, `tokenizer_config.json`) here, or from GGUF
metadata by `gpu.loading.gguf_tokenizer`. Requests are always tokenized by the model that
will run them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

from gpu.errors import CheckpointError
from gpu.loading.chat_template import open_final_message, render_chat


class Tokenizer:
    """Text ↔ token ids for one model."""

    def __init__(
        self,
        inner: tokenizers.Tokenizer,
        *,
        eos_token_ids: Sequence[int] = (),
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.inner = inner
        self.eos_token_ids = tuple(eos_token_ids)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return int(self.inner.get_vocab_size(with_added_tokens=True))

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes one token decodes to on its own (bounds a text's size)."""
        ids = [[i] for i in range(self.vocab_size)]
        texts = self.inner.decode_batch(ids, skip_special_tokens=False)
        return max((len(t.encode()) for t in texts), default=1)

    @functools.cached_property
    def vocab_digest(self) -> str:
        """A sha256 ("sha256:<hex>") over the vocabulary (each token's text and id) and the
        special (added) tokens: equal digests tokenize alike, so one model's ids mean the same
        to the other (a draft model's proposals, `gpu.speculative.draft_model`). Stable across
        processes."""
        vocab = sorted(self.inner.get_vocab(with_added_tokens=True).items(), key=lambda t: t[1])
        added = sorted(
            (i, t.content, t.special) for i, t in self.inner.get_added_tokens_decoder().items()
        )
        text = json.dumps({"vocab": vocab, "added": added}, ensure_ascii=False)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(
        self, texts: Sequence[str], *, add_special_tokens: bool = True
    ) -> list[list[int]]:
        encodings = self.inner.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(e.ids) for e in encodings]

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.inner.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Render chat messages (and the tools they may call) to the prompt text this model
        was trained on.

        `continue_final_message`: the last message is left open, for the model to continue
        (`open_final_message`); `template_kwargs`: more variables for the template.
        """
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        text = render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            tools=tools,
            extra=template_kwargs,
        )
        if continue_final_message and messages:
            text = open_final_message(text, str(messages[-1].get("content") or ""))
        return text

    @classmethod
    def from_hf_folder(cls, folder: Path, eos_token_ids: Sequence[int] = ()) -> Tokenizer:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(path, "tokenizer.json not found")
        try:
            inner = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise CheckpointError(path, f"cannot read tokenizer: {exc}") from exc
        cfg = _read_json(folder / "tokenizer_config.json")
        template = cfg.get("chat_template")
        template_file = folder / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        eos = _token_text(cfg.get("eos_token"))
        ids = list(eos_token_ids)
        if eos is not None and (eos_id := inner.token_to_id(eos)) is not None and eos_id not in ids:
            ids.append(eos_id)
        return cls(
            inner,
            eos_token_ids=ids,
            bos_token=_token_text(cfg.get("bos_token")),
            eos_token=eos,
            chat_template=template if isinstance(template, str) else None,
        )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"cannot parse: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as a dict
        value = value.get("content")
    return value if isinstance(value, str) else None
