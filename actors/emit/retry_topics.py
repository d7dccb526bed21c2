"""The retry topics, checked at the emitter's first start: retries go out only if they exist.

A worker creates no topic (`tokenmill topics create` does). One whose retry topics are
missing, or that may not write them, still runs: it logs `retry_topics_unusable` (an error,
naming the topics and the fix) once, and dead-letters a request at its first transient
failure, as if its attempts were spent (its error result goes out as before). Retrying
instead into a topic that is not there would hold each such result back for as long as the
producer waits for the topic's metadata. A broker that does not answer the question is asked
again at the producer's next start; until one does, no request is retried.
"""

from __future__ import annotations

import structlog

from actors.config import WorkerConfig
from actors.kafka.preflight import topic_check

log = structlog.get_logger("tokenmill.emitter")


class RetryTopics:
    def __init__(self) -> None:
        self.checked = False  # a broker answered for every retry topic
        self.usable = False  # each exists, and this worker may write it

    async def check(self, config: WorkerConfig) -> bool:
        """Whether every retry topic of `config` exists and is writable (True when there are
        none to check: no retries are configured). Asked once a broker answers."""
        if self.checked or not config.retry_topics:
            return self.usable
        reasons = []
        for topic in config.retry_topics:
            check = await topic_check(config.kafka, topic)
            if not check.answered:
                log.warning("retry_topics_unchecked", topic=topic, reason=check.reason)
                return False
            if not check.writable:
                reasons.append(check.reason)
        self.checked, self.usable = True, not reasons
        if reasons:
            log.error("retry_topics_unusable", topics=list(config.retry_topics),
                      reasons=reasons, max_attempts=config.max_attempts,
                      detail="transient failures are dead-lettered at once; create the "
                      "topics (tokenmill topics create) or set --max-attempts 1")  # fmt: skip
        else:
            log.info("retry_topics_checked", topics=list(config.retry_topics))
        return self.usable
