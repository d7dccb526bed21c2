"""A topic deleted while the producer still holds its metadata: its queued records are failed
(retriable, so they are sent again and wait apart) instead of sitting in the producer, and a
transaction stops waiting to add its partitions. `evict` runs on aiokafka's own accumulator
and transaction manager, whose insides it reaches into."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.producer.transaction_manager import TransactionManager
from aiokafka.structs import TopicPartition

from actors.emit import vanished
from actors.emit.vanished import TopicVanished, VanishWatch, evict
from actors.send_errors import Verdict, verdict
from tests.unit.actors.emit.fake_producer import MetadataProducer

GONE, KEPT = TopicPartition("gone.results", 0), TopicPartition("kept.results", 0)


@pytest.fixture(autouse=True)
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vanished, "POLL_S", 0.01)
    monkeypatch.setattr(vanished, "STALE_S", 0.02)
    monkeypatch.setattr(vanished, "ASK_S", 0.01)


def producer_of(accumulator: MessageAccumulator, manager: TransactionManager | None) -> Any:
    return SimpleNamespace(_message_accumulator=accumulator, _txn_manager=manager)


def accumulator(manager: TransactionManager | None = None) -> MessageAccumulator:
    leaders = SimpleNamespace(leader_for_partition=lambda tp: 0)  # every partition on node 0
    return MessageAccumulator(leaders, 16384, 0, 3600.0, txn_manager=manager)


async def test_queued_records_for_the_topic_fail_retriably_and_the_others_stay() -> None:
    queue = accumulator()
    gone = await queue.add_message(GONE, None, b"a", timeout=1.0)
    kept = await queue.add_message(KEPT, None, b"b", timeout=1.0)
    assert evict(producer_of(queue, None), GONE.topic, TopicVanished(GONE.topic)) == 1
    with pytest.raises(TopicVanished) as failed:
        await gone
    assert verdict(failed.value) is Verdict.RETRY, "sent again, to wait apart for its topic"
    assert not kept.done() and list(queue._batches) == [KEPT]


async def test_a_batch_sent_once_and_queued_again_leaves_nothing_in_flight() -> None:
    queue = accumulator()
    gone = await queue.add_message(GONE, None, b"a", timeout=1.0)
    nodes, _ = queue.drain_by_nodes(ignore_nodes=set())  # the sender takes it...
    queue.reenqueue(nodes[0][GONE])  # ...and the broker's "unknown topic" sends it back
    assert evict(producer_of(queue, None), GONE.topic, TopicVanished(GONE.topic)) == 1
    with pytest.raises(TopicVanished):
        await gone
    await asyncio.sleep(0)  # the batch's own callbacks
    assert not queue._pending_batches, "a flush would otherwise wait for it forever"


async def test_a_transaction_stops_waiting_to_add_the_topics_partitions() -> None:
    manager = TransactionManager("tokenmill.g.requests.0", 60_000)
    manager.set_pid_and_epoch(7, 0)
    manager.begin_transaction()
    manager.maybe_add_partition_to_txn(GONE)
    manager.maybe_add_partition_to_txn(KEPT)
    evict(producer_of(accumulator(manager), manager), GONE.topic, TopicVanished(GONE.topic))
    assert manager.partitions_to_add() == {KEPT}


async def test_a_topic_the_producer_no_longer_knows_is_evicted() -> None:
    fake = MetadataProducer({"gone.results"}, broker=None, deleted=frozenset({"gone.results"}))
    counts: list[str] = []
    watch = VanishWatch(cast(Any, fake), count=counts.append)
    ack = watch.track("gone.results", await fake.send("gone.results", value=b"", key=None,
                                                     headers=[]))  # fmt: skip
    fake.known.discard("gone.results")  # the producer's own metadata update dropped it
    with pytest.raises(TopicVanished):
        await asyncio.wait_for(ack, 10)
    assert counts == ["topic_vanished"]
    watch.close()


async def test_a_topic_the_broker_no_longer_has_is_evicted_after_the_metadata_update() -> None:
    fake = MetadataProducer({"gone.results", "kept.results"}, broker={"kept.results"},
                            deleted=frozenset({"gone.results"}))  # fmt: skip
    watch = VanishWatch(cast(Any, fake))
    ack = watch.track("gone.results", await fake.send("gone.results", value=b"", key=None,
                                                     headers=[]))  # fmt: skip
    with pytest.raises(TopicVanished):
        await asyncio.wait_for(ack, 10)
    assert fake.metadata_updates == 1 and fake.known == {"kept.results"}, (
        "sent again, its record finds the topic unknown and waits apart"
    )
    watch.close()


async def test_a_broker_that_does_not_answer_evicts_nothing() -> None:
    fake = MetadataProducer({"slow.results"}, broker=None, deleted=frozenset({"slow.results"}))
    asked = asyncio.Event()
    never = fake.client.fetch_all_metadata

    async def fetch() -> Any:
        asked.set()
        return await never()

    fake.client.fetch_all_metadata = fetch
    watch = VanishWatch(cast(Any, fake))
    ack = watch.track("slow.results", await fake.send("slow.results", value=b"", key=None,
                                                     headers=[]))  # fmt: skip
    await asyncio.wait_for(asked.wait(), 10)
    asked.clear()
    await asyncio.wait_for(asked.wait(), 10)  # asked twice: the first question timed out
    assert not ack.done(), "a broker away is not a topic gone"
    watch.close()
