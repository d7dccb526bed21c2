"""A lane's records the broker refused: which failed, and what each becomes next time.

    failures = await failed(firsts)                # every ack awaited; fenced ones raise
    settled = rework(p, i, failure, planner, config)   # False: a dead letter refused for good

After an aborted transaction a refused result is answered instead (`result_too_large`,
`reply_to_refused`), a refused retry is dead-lettered with its error result, a dead letter is
trimmed; a dead letter refused even trimmed is the lane's to hold back (`blocked`). A failure
that is not a refusal (the broker away) leaves the record as it is, made again.
"""

from __future__ import annotations

from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)

from actors.config import WorkerConfig
from actors.emit.dead_letters import trimmed_dead_letter
from actors.emit.planning import OutcomePlanner
from actors.emit.records import Pending
from actors.send_errors import Verdict, refusal_code, verdict

FENCED = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)

Failure = tuple[Pending, int, BaseException]  # an outcome, its record's index, the failure


async def failed(firsts: list[Pending]) -> list[Failure]:
    """Every record's acknowledgement awaited; the failed ones (a fenced one raises)."""
    out = []
    for p in firsts:
        for i, ack in enumerate(p.acks):
            try:
                await ack
            except FENCED:
                raise
            except KafkaError as exc:
                out.append((p, i, exc))
    return out


def rework(
    p: Pending, i: int, failure: BaseException, planner: OutcomePlanner, config: WorkerConfig
) -> bool:
    """Make `p`'s record `i`, refused with `failure`, what it is next time; False when it is a
    dead letter refused even trimmed (it must wait)."""
    record = p.records[i]
    if verdict(failure) is not Verdict.REFUSED:
        return True  # made again as it is
    if record.is_result and p.answered is None:
        planner.answer_instead(p, refusal_code(failure), f"{record.topic}: {failure!r}", config)
        planner.plan(p, config)
    elif record.is_retry:  # dead-lettered with its error result instead
        planner.retry_refused(p, failure, config)
    elif record.is_dead_letter:
        trimmed = trimmed_dead_letter(record, failure)
        if trimmed is None:
            return False
        p.records[i] = trimmed
    return True
