"""vLLM's `return_tokens_as_token_ids`: a result's logprob tokens written "token_id:N".

A token that is a piece of a character, or that several ids decode to alike, cannot be told
from its text; its id can. The request asked for it in its metadata (`TOKENS_AS_IDS_KEY`);
`tokens_as_ids` rewrites the result before it is shaped into an answer.
"""

from __future__ import annotations

import msgspec

from messages.result import GenerateResult, TokenLogprobs


def token_id_text(token_id: int) -> str:
    return f"token_id:{token_id}"


def tokens_as_ids(result: GenerateResult) -> GenerateResult:
    """`result` with every logprob token's text (each token's, and its alternatives') made of
    its id; the texts of the answer (`text`, `prompt_text`) unchanged."""
    choices = [
        msgspec.structs.replace(c, logprobs=_as_ids(c.logprobs, c.token_ids))
        for c in result.choices
    ]
    prompt = result.prompt_logprobs
    return msgspec.structs.replace(
        result,
        logprobs=_as_ids(result.logprobs, result.token_ids),
        prompt_logprobs=None if prompt is None else _as_ids(prompt, prompt.token_ids),
        choices=choices,
    )


def _as_ids(lp: TokenLogprobs | None, token_ids: list[int]) -> TokenLogprobs | None:
    """`lp`, whose entry i is about `token_ids[i]`, with texts made of ids."""
    if lp is None:
        return None
    return msgspec.structs.replace(
        lp,
        tokens=[token_id_text(t) for t in token_ids[: len(lp.tokens)]],
        top_tokens=[[token_id_text(t) for t in ids] for ids in lp.top_ids],
    )
