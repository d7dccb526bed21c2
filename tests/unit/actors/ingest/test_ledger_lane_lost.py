"""Exactly-once: a partition whose lane died while the ingest still holds it stops the ingest
at its next poll, so that its restart rejoins the group (`Ledger.lane_lost`); a partition
handed off meanwhile is its new owner's and changes nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from actors.ingest.ledger import Ledger
from tests.unit.actors.transactions.fakes import worker_config

TP0, TP1 = TopicPartition("requests", 0), TopicPartition("requests", 1)


def ledger_holding(*assigned: TopicPartition) -> Ledger:
    consumer = SimpleNamespace(assignment=lambda: set(assigned))
    reader = SimpleNamespace(consumer=consumer, generation=1)
    return Ledger(worker_config(), cast(Any, reader))


async def test_a_lost_lane_of_a_held_partition_stops_the_next_poll() -> None:
    ledger = ledger_holding(TP0, TP1)
    ledger.lane_lost(TP1, "ProducerFenced()")

    with pytest.raises(KafkaError, match="requests/1"):
        await ledger.claim({}, generation=1)


async def test_a_lost_lane_of_a_partition_handed_off_meanwhile_changes_nothing() -> None:
    ledger = ledger_holding(TP0)
    ledger.lane_lost(TP1, "ProducerFenced()")

    assert await ledger.claim({}, generation=1) is False  # nothing fetched, nothing to stop
