"""`POST /tokenize` and `POST /detokenize`, in vLLM's shapes, with the tokenizer of a model
the fleet serves, read on this host (`ops.gateway.tokenizers`):

    {model, prompt, add_special_tokens=true}                       → {count, max_model_len,
    {model, messages, add_generation_prompt=true, add_special_tokens=false}   tokens, token_strs}
    {model, tokens}                                                → {prompt}

`model` may be left out when the fleet serves one model. A model the fleet does not serve:
404 `model_not_found`; one whose files are not on this host: 503 `tokenizer_unavailable`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from fastapi import APIRouter, Request

from gpu.loading.tokenizer import Tokenizer
from messages.openai_batch_mapping import LineCode
from ops.gateway.bodies import parse_body, read_body
from ops.gateway.errors import ApiError, model_not_found
from ops.gateway.fleet import ServedModel
from ops.gateway.routes.deps import KEYED, Parts, PartsDep
from ops.gateway.routes.generating import served_alone

router = APIRouter(dependencies=KEYED)
T = TypeVar("T")


class _Prompt(msgspec.Struct):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False


class _Chat(msgspec.Struct):
    messages: list[dict[str, Any]]
    model: str | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # the chat template writes the special tokens
    return_token_strs: bool = False


class _Tokens(msgspec.Struct):
    tokens: list[int]
    model: str | None = None


@router.post("/tokenize")
async def tokenize(request: Request, parts: PartsDep) -> dict[str, Any]:
    body = parse_body(await read_body(request, parts.gateway.settings.max_body_bytes))
    asked: _Chat | _Prompt = _decode(body, _Chat) if "messages" in body else _decode(body, _Prompt)
    served, tokenizer = await _tokenizer(parts, asked.model)
    if isinstance(asked, _Chat):
        text = _render(tokenizer, asked.messages, asked.add_generation_prompt)
    else:
        text = asked.prompt
    ids = tokenizer.encode(text, add_special_tokens=asked.add_special_tokens)
    strs = [tokenizer.inner.id_to_token(i) for i in ids] if asked.return_token_strs else None
    return {
        "count": len(ids),
        "max_model_len": served.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


@router.post("/detokenize")
async def detokenize(request: Request, parts: PartsDep) -> dict[str, Any]:
    body = parse_body(await read_body(request, parts.gateway.settings.max_body_bytes))
    asked = _decode(body, _Tokens)
    _, tokenizer = await _tokenizer(parts, asked.model)
    if any(not 0 <= t < tokenizer.vocab_size for t in asked.tokens):
        raise ApiError(400, f"a token id is outside the vocabulary (0..{tokenizer.vocab_size - 1})",
                       code=LineCode.INVALID_BODY, param="tokens")  # fmt: skip
    return {"prompt": tokenizer.decode(asked.tokens, skip_special_tokens=False)}


async def _tokenizer(parts: Parts, model: str | None) -> tuple[ServedModel, Tokenizer]:
    """The model `model` names (else the one the fleet serves) and its tokenizer."""
    name = model or served_alone(parts)
    if not name:
        raise ApiError(400, "name the `model` to tokenize with", code=LineCode.INVALID_BODY,
                       param="model")  # fmt: skip
    found = parts.fleet.fleet.find(name) if parts.fleet is not None else ServedModel(name, 0)
    if found is None:
        raise model_not_found(name)
    return found, await parts.tokenizers.get(found.name)


def _render(tokenizer: Tokenizer, messages: list[dict[str, Any]], generation: bool) -> str:
    if not tokenizer.chat_template:
        raise ApiError(400, "this model has no chat template: send `prompt`",
                       code=LineCode.INVALID_BODY, param="messages")  # fmt: skip
    chat = [m | {"content": _text(m.get("content"))} for m in messages]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=generation)


def _text(content: Any) -> Any:
    """A message's content parts joined into its text (a string stays as it is)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content


def _decode(body: dict[str, Any], kind: type[T]) -> T:
    try:
        return msgspec.convert(body, type=kind)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid body: {exc}", code=LineCode.INVALID_BODY) from None
