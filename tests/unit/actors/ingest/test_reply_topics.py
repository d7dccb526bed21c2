"""The reply_to policy and the broker's topic names as the ingest sees them."""

from __future__ import annotations

import pytest

from actors.ingest.reply_topics import KnownTopics, ReplyPolicy

POLICY = ReplyPolicy.of(
    results_topic="tokenmill.results",
    own_topics=("tokenmill.requests", "tokenmill.dlq", "tokenmill.control", None),
)


@pytest.mark.parametrize("topic", ["tokenmill.results", "team.results", "a.b.results"])
def test_the_results_topic_and_dot_results_are_allowed_by_default(topic: str) -> None:
    assert POLICY.refusal(topic) is None


@pytest.mark.parametrize(
    ("topic", "why"),
    [
        ("__consumer_offsets", "internal"),
        ("__x.results", "internal"),
        ("tokenmill.requests", "own"),
        ("tokenmill.control", "own"),
        ("tokenmill.dlq", "own"),
        ("team.replies", "matches none"),
        ("results", "matches none"),
        ("team.Results", "matches none"),  # patterns are case-sensitive, as topics are
    ],
)
def test_internal_own_and_unmatched_topics_are_refused(topic: str, why: str) -> None:
    refusal = POLICY.refusal(topic)
    assert refusal is not None and why in refusal and repr(topic) in refusal


def test_own_topics_are_refused_even_when_a_pattern_matches() -> None:
    policy = ReplyPolicy.of(
        results_topic="r", own_topics=("jobs.results",), allowed=("*.results", "*")
    )
    assert policy.refusal("jobs.results") is not None
    assert policy.refusal("anything") is None


def test_the_results_topic_stays_allowed_with_no_patterns() -> None:
    policy = ReplyPolicy.of(results_topic="r", own_topics=("r", "q"), allowed=())
    assert policy.refusal("r") is None
    assert policy.refusal("x.results") is not None


class Broker:
    def __init__(self, topics: set[str]) -> None:
        self.topics = topics
        self.asked = 0
        self.down = False

    async def list_topics(self) -> set[str]:
        self.asked += 1
        if self.down:
            raise ConnectionError("broker away")
        return set(self.topics)


async def test_a_missing_topic_is_asked_again_at_most_every_min_refresh() -> None:
    now = [0.0]
    broker = Broker({"a.results"})
    known = KnownTopics(broker.list_topics, min_refresh_s=2.0, clock=lambda: now[0])
    assert await known.exists("a.results") is True
    assert await known.exists("a.results") is True and broker.asked == 1  # cached
    assert await known.exists("b.results") is False and broker.asked == 1  # asked just now
    broker.topics.add("b.results")
    now[0] = 2.5
    assert await known.exists("b.results") is True and broker.asked == 2
    for name in (f"x{i}.results" for i in range(100)):  # a flood of unknown names
        assert await known.exists(name) is False
    assert broker.asked == 2


async def test_an_unreachable_broker_answers_none_and_is_not_asked_again_at_once() -> None:
    now = [0.0]
    broker = Broker({"a.results"})
    broker.down = True
    known = KnownTopics(broker.list_topics, clock=lambda: now[0])
    assert await known.exists("a.results") is None
    assert await known.exists("a.results") is None and broker.asked == 1
    broker.down = False
    now[0] = 3.0
    assert await known.exists("a.results") is True
