"""Dead letters: the DLQ checked at the first start, and one the DLQ refuses trimmed."""

from __future__ import annotations

import structlog
from aiokafka.errors import KafkaError

from actors.config import WorkerConfig
from actors.emit.records import Record
from actors.kafka.errors import KafkaUnusable
from actors.kafka.preflight import topic_check
from messages import headers as h

log = structlog.get_logger("tokenmill.emitter")


class DeadLetterTopic:
    """The DLQ topic, checked once, at the emitter's first start."""

    def __init__(self) -> None:
        self.checked = False  # answered (writable, or `KafkaUnusable` was raised)

    async def check(self, config: WorkerConfig) -> None:
        """`KafkaUnusable` unless the DLQ topic exists and this worker may write it. A broker
        that does not answer the question is asked again at the next call (the producer's
        next start; the sends wait for it meanwhile)."""
        if self.checked:
            return
        topic = config.dlq_topic
        check = await topic_check(config.kafka, topic)
        if not check.answered:
            log.warning("dlq_unchecked", topic=topic, reason=check.reason)
            return
        self.checked = True
        if not check.writable:
            log.error("dlq_unusable", topic=topic, reason=check.reason)
            raise KafkaUnusable(
                f"dead-letter topic: {check.reason}; create it (tokenmill topics create) or "
                "let this worker write it: a dead letter it cannot write stops its "
                "partition's commits"
            )
        log.info("dlq_checked", topic=topic)


def trimmed_dead_letter(record: Record, exc: KafkaError) -> Record | None:
    """A dead letter the DLQ refused, without its value and the original headers (None when
    it is that already: then it can only wait for the DLQ to take it).

    It keeps the headers tokenmill wrote (its own and Kafka Connect's), each once: the last
    of a name, as the original headers come first. So it is a few KB, whatever the original.
    """
    ours = list({k: v for k, v in record.headers if k in h.DEAD_LETTER_HEADERS}.items())
    if not record.value and list(record.headers) == ours:
        return None
    log.warning("dead_letter_trimmed", topic=record.topic, error=repr(exc))
    return Record(record.topic, b"", record.key, ours, "dead_letter")
