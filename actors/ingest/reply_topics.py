"""Where a request's result may go: the `reply_to` policy, and the topics the broker has.

A request names its reply topic, so a careless or hostile producer could otherwise send results
into Kafka's internal topics, back into the requests topic (read again as requests), into the
control plane, or, with broker auto-create on, make new topics. The policy refuses:
- internal topics (names starting with `__`) and the worker's own topics (requests, control,
  events, DLQ; the results topic is the default and always allowed);
- any name matching none of the allowed patterns (`fnmatch`, case-sensitive; by default the
  results topic and `*.results`).
A name the policy allows must also exist: `KnownTopics` asks the broker's metadata (cached, and
asked again on a miss at most every `min_refresh_s`), so a request never makes the producer wait
for a topic that is not there.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.validation import is_topic_name

DEFAULT_ALLOWED_PATTERNS = ("*.results",)  # beside the results topic itself


@dataclass(frozen=True)
class ReplyPolicy:
    results_topic: str
    own_topics: frozenset[str]  # the worker's topics no result may go to
    allowed: tuple[str, ...]  # fnmatch patterns

    @classmethod
    def of(
        cls,
        *,
        results_topic: str,
        own_topics: Iterable[str | None],
        allowed: Iterable[str] | None = None,
    ) -> ReplyPolicy:
        """`allowed` None: the results topic and `*.results`."""
        patterns = tuple(allowed) if allowed is not None else DEFAULT_ALLOWED_PATTERNS
        own = frozenset(t for t in own_topics if t) - {results_topic}
        return cls(results_topic, own, (results_topic, *patterns))

    def refusal(self, topic: str) -> str | None:
        """Why results may not go to `topic`, or None when they may."""
        if topic == self.results_topic:
            return None
        if topic.startswith("__"):
            return f"reply_to {topic!r} is an internal Kafka topic"
        if topic in self.own_topics:
            return f"reply_to {topic!r} is one of this worker's own topics"
        if not any(fnmatch.fnmatchcase(topic, p) for p in self.allowed):
            return f"reply_to {topic!r} matches none of the allowed: {', '.join(self.allowed)}"
        return None


# How often, at most, a worker asks the broker again for a topic it does not know: a topic
# created this long ago is known to every worker (`tokenmill gateway` waits it out).
MIN_REFRESH_S = 2.0


class KnownTopics:
    """The broker's topic names as last read, read again when a name is missing.

    `list_topics()`: every topic name the client may see (one metadata request).
    """

    def __init__(
        self,
        list_topics: Callable[[], Awaitable[set[str]]],
        *,
        min_refresh_s: float = MIN_REFRESH_S,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list_topics = list_topics
        self._min_refresh_s = min_refresh_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._topics: set[str] = set()
        self._asked_at: float | None = None
        self._failed = False  # the last ask failed

    async def exists(self, topic: str) -> bool | None:
        """Whether the broker has `topic`; None when the broker could not be asked."""
        if topic in self._topics:
            return True
        now = self._clock()
        if self._asked_at is not None and now - self._asked_at < self._min_refresh_s:
            return None if self._failed else False
        self._asked_at = now
        try:
            topics = await asyncio.wait_for(self._list_topics(), self._timeout_s)
        except Exception:  # broker away or slow: the emitter answers a refusal if one comes
            self._failed = True
            return None
        self._topics, self._failed = set(topics), False
        return topic in self._topics


@dataclass(frozen=True)
class ReplyTopics:
    """The policy and the broker's topics together, as the ingest asks them."""

    policy: ReplyPolicy
    known: KnownTopics

    async def check(self, reply_to: str | None) -> None:
        """Raise `InvalidRequest` when results may not, or cannot, go to `reply_to`."""
        if reply_to is None:
            return
        refusal = self.policy.refusal(reply_to)
        if refusal is not None:
            raise InvalidRequest(ErrorCode.REPLY_TO_NOT_ALLOWED, refusal)
        if await self.known.exists(reply_to) is False:
            raise InvalidRequest(
                ErrorCode.REPLY_TO_REFUSED, f"reply_to {reply_to!r}: no such topic on the broker"
            )

    async def usable(self, reply_to: str) -> bool:
        """Whether an error result may go to a request's own `reply_to`."""
        if not is_topic_name(reply_to) or self.policy.refusal(reply_to) is not None:
            return False
        return await self.known.exists(reply_to) is not False
