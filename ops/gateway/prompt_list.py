"""`/v1/completions` with a list of prompts: one request per prompt, one answer for all.

    bodies = split_prompts(body)          # None: one prompt (as the mapper takes it)
    ...each body asked as its own request...
    status, merged = merge_answers(answers, n=body.get("n") or 1)

OpenAI's `prompt` may be a string, a list of strings, a list of token ids, or a list of
token-id lists. The mapper takes one prompt (a string, a one-string list, or token ids); a
list of several is split here into bodies of one prompt each. The answer holds every prompt's
choices, indexed as OpenAI indexes them: prompt i's choice j is `index` i × n + j. Usage is
summed. The first refusal (in prompt order) answers for the whole request, as one bad prompt
makes OpenAI refuse it all.

Pure functions: no I/O.
"""

from __future__ import annotations

from typing import Any

from messages.openai_batch_mapping import LineCode
from ops.gateway.errors import ApiError

MAX_PROMPTS = 256  # prompts in one request; a file of more goes through /v1/batches


def split_prompts(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """One body per prompt when `body["prompt"]` holds several, else None. `ApiError` 400
    for an empty list, a mix of kinds, more than `MAX_PROMPTS`, or several with `stream`."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not _several(prompt):
        return None
    if len(prompt) > MAX_PROMPTS:
        raise ApiError(
            400,
            f"at most {MAX_PROMPTS} prompts in one request, got {len(prompt)}: send more "
            "through /v1/batches",
            code=LineCode.INVALID_BODY,
            param="prompt",
        )
    if body.get("stream"):
        raise ApiError(
            400,
            "`stream: true` with several prompts is not supported: stream one prompt per "
            "request, or ask without streaming",
            code=LineCode.UNSUPPORTED_PARAMETER,
            param="stream",
        )
    return [{**body, "prompt": one} for one in prompt]


def _several(prompt: list[Any]) -> bool:
    """A list of strings (two or more) or a list of token-id lists (one or more)."""
    if prompt and all(isinstance(p, list) for p in prompt):
        return True
    if len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        return True
    if prompt and any(isinstance(p, list) for p in prompt):
        raise ApiError(
            400,
            "`prompt` mixes token-id lists with other kinds: send strings, token ids, or "
            "lists of token ids",
            code=LineCode.INVALID_BODY,
            param="prompt",
        )
    return False


def merge_answers(answers: list[tuple[int, Any]], *, n: int) -> tuple[int, Any]:
    """One answer for every prompt's (status, body), in prompt order."""
    for status, body in answers:
        if status != 200:
            return status, body
    merged: dict[str, Any] = {**answers[0][1], "choices": []}
    usage: dict[str, Any] = {}
    for i, (_, body) in enumerate(answers):
        for choice in body["choices"]:
            merged["choices"].append({**choice, "index": i * n + choice["index"]})
        usage = _summed(usage, body.get("usage") or {})
    if usage:
        merged["usage"] = usage
    return 200, merged


def _summed(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Counts added key by key, nested details too."""
    out = dict(total)
    for key, value in more.items():
        if isinstance(value, dict):
            out[key] = _summed(out.get(key) or {}, value)
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = out.get(key, 0) + value
        else:
            out.setdefault(key, value)
    return out
