"""Fields as clients send them, through `tokenmill gateway` to a real SmolLM2 worker with the
official `openai` SDK: a chat without `max_tokens` is not cut at 16 tokens, and vLLM's extras
(in `extra_body`, as clients send them) change the answer as they say."""

from __future__ import annotations

import pytest

from tests.integration.gateway_fleet import MODEL, Fleet, client, gateway

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Explain photosynthesis to a child in a few sentences."}]


async def test_a_chat_without_max_tokens_is_not_cut_at_16(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        chat = await api.chat.completions.create(model=MODEL, messages=ASK, temperature=0)
        assert chat.usage is not None and chat.usage.completion_tokens > 16
        text = await api.completions.create(model=MODEL, prompt="Photosynthesis is")
        assert text.usage is not None and text.usage.completion_tokens <= 16


async def test_vllm_s_extras_are_served(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        free = await api.completions.create(
            model=MODEL,
            prompt="The three primary colors are",
            max_tokens=12,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert free.usage is not None and free.usage.completion_tokens == 12
        text = free.choices[0].text
        needle = text.strip().split()[1]
        kept = await api.completions.create(
            model=MODEL,
            prompt="The three primary colors are",
            max_tokens=12,
            temperature=0,
            stop=[needle],
            extra_body={"include_stop_str_in_output": True, "request_id": "mine-1"},
        )
        assert kept.choices[0].text == text[: text.index(needle) + len(needle)]
        assert kept.id == "cmpl-mine-1"

        scored = await api.chat.completions.create(
            model=MODEL,
            messages=ASK,
            max_tokens=3,
            temperature=0,
            logprobs=True,
            extra_body={"return_tokens_as_token_ids": True},
        )
        content = scored.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content and all(t.token.startswith("token_id:") for t in content)

        continued = await api.chat.completions.create(
            model=MODEL,
            messages=[*ASK, {"role": "assistant", "content": "Photosynthesis is how plants"}],
            max_tokens=8,
            temperature=0,
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
        assert continued.choices[0].message.content
        assert not continued.choices[0].message.content.startswith("Photosynthesis")
