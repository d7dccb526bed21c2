"""Speculative decoding through a real worker on SmolLM2: a worker started with
`--speculative ngram` answers the same jobs with the same text as a worker without, says in
each result's usage how many guessed tokens it kept, and counts them on /metrics."""

from __future__ import annotations

import pytest

from messages.request import ChatMessage, GenerateRequest
from messages.result import GenerateResult
from tests.integration.serving import serve_waves

pytestmark = pytest.mark.slow

RECORD = (
    "Name: Ada Lovelace. Born: 10 December 1815, London. Known for: the first published "
    "algorithm, written for Charles Babbage's Analytical Engine. Died: 27 November 1852."
)


def jobs() -> list[GenerateRequest]:
    """Input-copying jobs (greedy and seeded), and one that opts out of speculation."""

    def chat(rid: str, content: str, **sampling: object) -> GenerateRequest:
        messages = [ChatMessage(role="user", content=content)]
        return GenerateRequest(id=rid, messages=messages, max_new_tokens=48, **sampling)  # type: ignore[arg-type]

    return [
        chat("repeat", f"Repeat this text exactly, word for word:\n{RECORD}"),
        chat("extract", f"Copy the name and the birth date from this record:\n{RECORD}"),
        chat("seeded", f"Repeat this text exactly:\n{RECORD}", temperature=0.7, seed=11),
        chat("opt-out", f"Repeat this text exactly:\n{RECORD}", speculate=False),
        GenerateRequest(id="plain", prompt="The capital of France is", max_new_tokens=12),
    ]


async def serve(
    kafka_bootstrap: str, tmp_path, smollm2_path, name: str, args: list[str]
) -> tuple[dict[str, GenerateResult], dict[str, float]]:
    """The jobs on a fresh worker: its results by id (each exactly once), its speculative
    metrics."""
    log = tmp_path / f"{name}.log"
    waves = [jobs()]
    return await serve_waves(
        kafka_bootstrap, smollm2_path, log, waves, args, metrics="tokenmill_speculative"
    )


async def test_a_speculating_worker_answers_as_one_without(
    kafka_bootstrap, tmp_path, smollm2_path
) -> None:
    fast, metrics = await serve(
        kafka_bootstrap, tmp_path, smollm2_path, "ngram", ["--speculative", "ngram"]
    )
    plain, plain_metrics = await serve(kafka_bootstrap, tmp_path, smollm2_path, "plain", [])
    for rid, result in plain.items():
        assert fast[rid].text == result.text, rid
        assert fast[rid].token_ids == result.token_ids, rid
        assert result.usage.accepted_draft_tokens == 0
    kept = fast["repeat"].usage.accepted_draft_tokens
    assert kept > 0, "the copying job kept no guessed token"
    assert fast["opt-out"].usage.accepted_draft_tokens == 0
    assert fast["opt-out"].usage.rejected_draft_tokens == 0
    accepted = sum(v for k, v in metrics.items() if k.startswith("tokenmill_speculative_accepted"))
    assert accepted >= kept
    assert not any(plain_metrics.values())
