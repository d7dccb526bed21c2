"""Prefix caching through a real worker on SmolLM2: requests sharing a long system prompt are
served from cached blocks, say so in `usage.cached_tokens` and on /metrics, and every answer
(greedy and seeded, shared prompt or not) is the same as a worker without caching gives."""

from __future__ import annotations

import pytest

from messages.request import ChatMessage, GenerateRequest
from messages.result import GenerateResult
from tests.integration.serving import serve_waves

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are the support assistant of a small bakery in Lyon. You answer questions about "
    "opening hours, bread, pastries, cakes made to order, allergens and delivery. Opening "
    "hours: Tuesday to Saturday from seven to seven, Sunday from seven to one, closed on "
    "Mondays. Every bread is baked on site from organic flour; the sourdough rests for "
    "twenty hours. Cakes made to order need two days' notice and a deposit of a third of "
    "the price. Deliveries cover the city centre on weekday mornings for orders above "
    "thirty euros. Always answer in one short, friendly sentence."
)
QUESTIONS = ["Are you open on Monday?", "How long does the sourdough rest?", "Do you deliver?"]


def requests() -> tuple[list[GenerateRequest], list[GenerateRequest]]:
    """(the first shared-prompt request, then the rest: shared ones interleaved with others)."""

    def chat(i: int, question: str, **sampling: object) -> GenerateRequest:
        messages = [
            ChatMessage(role="system", content=SYSTEM),
            ChatMessage(role="user", content=question),
        ]
        return GenerateRequest(id=f"shared-{i}", messages=messages, max_new_tokens=12, **sampling)  # type: ignore[arg-type]

    first = chat(0, "When do you open on Sunday?")
    rest = [
        chat(1, QUESTIONS[0]),
        GenerateRequest(id="plain-0", prompt="The capital of France is", max_new_tokens=8),
        chat(2, QUESTIONS[1], temperature=0.8, top_p=0.9, seed=5),
        GenerateRequest(id="plain-1", prompt="Two plus two is", max_new_tokens=8),
        chat(3, QUESTIONS[2]),
    ]
    return [first], rest


async def serve(
    kafka_bootstrap: str, tmp_path, smollm2_path, name: str, env: dict[str, str]
) -> tuple[dict[str, GenerateResult], dict[str, float]]:
    """Run the requests on a fresh worker: the first alone, then the rest; its results by id
    (each exactly once) and its prefix-cache metrics."""
    first, rest = requests()
    log = tmp_path / f"{name}.log"
    return await serve_waves(
        kafka_bootstrap, smollm2_path, log, [first, rest], env=env, metrics="tokenmill_kv_prefix"
    )


async def test_shared_system_prompts_are_served_from_cache_and_answers_do_not_change(
    kafka_bootstrap, tmp_path, smollm2_path
) -> None:
    cached, metrics = await serve(kafka_bootstrap, tmp_path, smollm2_path, "cached", {})
    plain, plain_metrics = await serve(
        kafka_bootstrap, tmp_path, smollm2_path, "plain", {"TOKENMILL_PREFIX_CACHING": "false"}
    )
    for rid, result in cached.items():
        assert (result.text, result.token_ids) == (plain[rid].text, plain[rid].token_ids), rid
        assert plain[rid].usage.cached_tokens == 0
    assert cached["shared-0"].usage.cached_tokens == 0  # it filled the cache
    for rid in ("shared-1", "shared-2", "shared-3"):
        usage = cached[rid].usage
        # The system prompt (over 100 tokens) is served whole blocks at a time.
        assert 96 <= usage.cached_tokens < usage.prompt_tokens, rid
        assert usage.cached_tokens % 16 == 0
    assert cached["plain-0"].usage.cached_tokens == cached["plain-1"].usage.cached_tokens == 0
    served = sum(r.usage.cached_tokens for r in cached.values())
    assert metrics["tokenmill_kv_prefix_hit_tokens_total"] == served
    assert 0 < metrics["tokenmill_kv_prefix_hit_ratio"] < 1
    assert plain_metrics["tokenmill_kv_prefix_hit_tokens_total"] == 0
