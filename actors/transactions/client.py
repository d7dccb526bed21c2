"""The ingest's side of `--exactly-once`: what it asks of the emitter's lanes, and waits for.

    failed = await client.take_over(partitions)   # fenced: the commits may be read now
    await client.start(LaneStart(...))            # each partition's last commit
    ok = await client.write(offsets)              # the Committer's `write`
    ok = await client.write(offsets, release=True)
    await client.hand_off(partitions)             # revoked: their lanes close

Each is a message to the emitter's mailbox carrying a future the emitter resolves, so the
ingest's rebalance callbacks can wait for the broker's side without sharing any state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka.structs import TopicPartition

from actors.mail import CommitOffsets, HandOff, LaneStart, TakeOver
from actors.runtime import Address

Request = TakeOver | LaneStart | CommitOffsets | HandOff


class TransactionsClient:
    def __init__(self, emitter: Address[Request]) -> None:
        self.emitter = emitter

    async def take_over(self, partitions: Iterable[TopicPartition]) -> frozenset[TopicPartition]:
        """Open the partitions' lanes (fencing their last owners); those that failed."""
        done: asyncio.Future[frozenset[TopicPartition]] = _future()
        await self.emitter.send(TakeOver(frozenset(partitions), done))
        return await done

    async def start(self, message: LaneStart) -> None:
        await self.emitter.send(message)

    async def write(
        self, offsets: dict[TopicPartition, tuple[int, str]], *, release: bool = False
    ) -> bool:
        done: asyncio.Future[bool] = _future()
        await self.emitter.send(CommitOffsets(offsets, release, done))
        return await done

    async def hand_off(self, partitions: Iterable[TopicPartition]) -> None:
        done: asyncio.Future[None] = _future()
        await self.emitter.send(HandOff(frozenset(partitions), done))
        await done


def _future() -> asyncio.Future:  # type: ignore[type-arg]
    return asyncio.get_running_loop().create_future()
