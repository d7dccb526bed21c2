"""`/v1/completions` with a list of prompts through the gateway, with the official SDK: one
choice per prompt (times `n`), indexed as OpenAI indexes them, each the worker's own answer."""

from __future__ import annotations

import openai
import pytest

from messages.openai_batch import COMPLETIONS_URL
from tests.integration.gateway_fleet import MODEL, Fleet, client, direct_text, gateway

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Water boils at", "The first letter is"]


async def test_a_list_of_prompts_is_answered_one_choice_each_in_order(fleet: Fleet) -> None:
    want = [
        await direct_text(
            fleet, COMPLETIONS_URL, {"model": MODEL, "prompt": p, "max_tokens": 6, "temperature": 0}
        )
        for p in PROMPTS
    ]
    async with gateway(fleet) as base, client(base) as api:
        got = await api.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0)
        assert [c.index for c in got.choices] == [0, 1, 2]
        assert [c.text for c in got.choices] == want
        assert got.usage is not None and got.usage.completion_tokens >= 3

        two = await api.completions.create(
            model=MODEL, prompt=PROMPTS[:2], max_tokens=4, n=2, seed=7, temperature=0.8
        )
        assert [c.index for c in two.choices] == [0, 1, 2, 3]

        with pytest.raises(openai.BadRequestError) as refused:
            await api.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=4, stream=True)
        assert refused.value.body["param"] == "stream"  # type: ignore[index]
