"""The scheduler with prefix caching: shared prompts reuse blocks, and every sequence still
attends to exactly its own tokens' K/V, through preemption, aborts and eviction.

A simulated pool records, for every slot a step writes, the token prefix that produced it (the
K/V of position p depend on tokens 0..p). Before each step computes, every position a chunk
attends to must hold its own sequence's prefix: a cache hit that maps the wrong block, or a
write into a shared block, shows up as a mismatch.
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu.block_allocator import BlockAllocator, blocks_for
from gpu.prefix_hash import root_key
from gpu.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from gpu.sequence import SamplingParams, Sequence, SequenceStatus
from tests.unit.gpu.test_scheduler import FakeClock

BLOCK = 4
ROOT = root_key("sha256:test", "none", "float32")


class CachedPool:
    """A scheduler with caching on, driven as the engine drives it, over a simulated pool."""

    def __init__(self, num_blocks: int, budget: int = 16, max_num_seqs: int = 4) -> None:
        self.clock = FakeClock()
        config = SchedulerConfig(
            block_size=BLOCK, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs
        )
        self.scheduler = Scheduler(config, BlockAllocator(num_blocks), self.clock, prefix_key=ROOT)
        self.slots: dict[int, tuple[int, ...]] = {}  # flat slot -> prefix whose K/V it holds
        self.rng = random.Random(0)
        self.finished: list[Sequence] = []

    def add(self, rid: str, prompt: list[int], new: int) -> Sequence:
        seq = Sequence(
            rid, list(prompt), SamplingParams(max_new_tokens=new), arrival_time=self.clock.now
        )
        self.scheduler.add(seq)
        return seq

    def step(self) -> ScheduledBatch:
        s = self.scheduler
        batch = s.schedule()
        a = s.allocator
        for chunk in batch.chunks:
            seq, tokens = chunk.seq, chunk.seq.token_slice(0, chunk.seq.num_tokens)
            assert chunk.start == seq.num_computed_tokens
            for p in range(chunk.start):  # what it attends to: its own prefix, everywhere
                slot = seq.block_table[p // BLOCK] * BLOCK + p % BLOCK
                assert self.slots.get(slot) == tuple(tokens[: p + 1]), (seq.request_id, p)
            for p in range(chunk.start, chunk.end):
                block = seq.block_table[p // BLOCK]
                assert a.ref_count(block) == 1, "a step writes into a shared block"
                self.slots[block * BLOCK + p % BLOCK] = tuple(tokens[: p + 1])
        s.advance(batch)
        for chunk in batch.chunks:
            if chunk.samples:
                seq = chunk.seq
                seq.output_token_ids.append(self.rng.choice([1, 2]))  # tiny alphabet: repeats
                if len(seq.output_token_ids) >= seq.params.max_new_tokens:
                    s.finish(seq, "length")
                    self.finished.append(seq)
        self.clock.now += 1.0
        return batch

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work():
                return
            self.step()
        raise AssertionError("work left")


def check_blocks(s: Scheduler) -> None:
    a = s.allocator
    assert a.num_empty + a.num_cached + a.num_used == a.num_blocks
    owners: dict[int, int] = {}
    for seq in s.running:
        assert len(seq.block_table) == blocks_for(seq.num_computed_tokens, BLOCK)
        for block in seq.block_table:
            owners[block] = owners.get(block, 0) + 1
    assert a.num_used == len(owners)
    for block in range(a.num_blocks):
        assert a.ref_count(block) == owners.get(block, 0)
    for seq in s.waiting:
        assert seq.block_table == [] and seq.num_computed_tokens == 0


SYSTEM = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # two full blocks and a half


def test_a_second_request_with_the_same_prefix_prefills_only_the_rest() -> None:
    pool = CachedPool(num_blocks=16)
    first = pool.add("a", [*SYSTEM, 20, 21], new=2)
    pool.run()
    assert first.num_cached_tokens == 0
    second = pool.add("b", [*SYSTEM, 30, 31, 32], new=2)
    batch = pool.step()
    assert batch.prompt_tokens == 13 and batch.cached_tokens == 8
    assert second.num_cached_tokens == 8
    assert [(c.start, c.end) for c in batch.chunks] == [(8, 13)]
    pool.run()
    check_blocks(pool.scheduler)


def test_a_prompt_wholly_cached_still_computes_its_last_token() -> None:
    pool = CachedPool(num_blocks=16)
    prompt = SYSTEM[:8]  # exactly two blocks
    pool.add("a", prompt, new=1)
    pool.run()
    pool.add("b", prompt, new=1)
    batch = pool.step()
    assert [(c.start, c.end, c.samples) for c in batch.chunks] == [(4, 8, True)]


def test_sequences_running_together_share_blocks_read_only() -> None:
    pool = CachedPool(num_blocks=16, budget=64)
    pool.add("a", [*SYSTEM, 1], new=6)
    pool.step()  # a's prompt is computed; its full blocks are registered
    b = pool.add("b", [*SYSTEM, 2], new=6)
    pool.step()
    a_seq = pool.scheduler.running[0]
    assert a_seq.block_table[:2] == b.block_table[:2]
    assert pool.scheduler.allocator.ref_count(b.block_table[0]) == 2
    check_blocks(pool.scheduler)
    pool.run()


def test_a_preempted_sequence_takes_its_own_cached_blocks_back() -> None:
    pool = CachedPool(num_blocks=12, budget=64)
    seq = pool.add("a", list(range(1, 30)), new=3)
    pool.step()
    pool.scheduler._preempt(seq)  # its 29 prompt tokens and first output token: 7 full blocks
    batch = pool.step()
    assert [(c.start, c.end) for c in batch.chunks] == [(28, 30)]
    assert seq.num_cached_tokens == 0  # the hit rate counts first admissions only
    assert batch.prompt_tokens == 0


def test_a_changed_model_key_finds_nothing() -> None:
    pool = CachedPool(num_blocks=16)
    pool.add("a", [*SYSTEM, 1], new=1)
    pool.run()
    other = Scheduler(
        pool.scheduler.config,
        pool.scheduler.allocator,
        pool.clock,
        prefix_key=root_key("sha256:other", "none", "float32"),
    )
    seq = Sequence("b", [*SYSTEM, 1], SamplingParams(max_new_tokens=1), 0.0)
    other.add(seq)
    assert other.schedule().cached_tokens == 0


class PrefixMachine(RuleBasedStateMachine):
    """Shared-prefix arrivals, steps, aborts and preemption by a small pool, in any order."""

    @initialize(num_blocks=st.integers(4, 14), budget=st.integers(1, 16), seqs=st.integers(1, 4))
    def make(self, num_blocks: int, budget: int, seqs: int) -> None:
        self.pool = CachedPool(num_blocks, budget, seqs)
        self.capacity = num_blocks * BLOCK
        self.live: list[Sequence] = []
        self.count = 0

    @rule(
        data=st.data(),
        prefix=st.sampled_from([[], SYSTEM, SYSTEM[:4], [3] * 9]),
        tail=st.lists(st.integers(1, 3), max_size=6),
    )
    def arrive(self, data: st.DataObject, prefix: list[int], tail: list[int]) -> None:
        prompt = (prefix + tail)[: self.capacity - 2] or [1]
        new = data.draw(st.integers(1, min(self.capacity - len(prompt), 6)))
        self.live.append(self.pool.add(f"r{self.count}", prompt, new))
        self.count += 1

    @rule()
    def step(self) -> None:
        self.pool.step()
        self.live = [q for q in self.live if not q.is_finished]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.live))
        self.pool.scheduler.finish(seq, "cancelled")
        self.live.remove(seq)
        assert seq.status is SequenceStatus.FINISHED and seq.block_table == []

    @invariant()
    def blocks_are_conserved(self) -> None:
        if hasattr(self, "pool"):
            check_blocks(self.pool.scheduler)

    def teardown(self) -> None:
        if hasattr(self, "pool"):
            self.pool.run(3000)
            a = self.pool.scheduler.allocator
            assert a.num_used == 0 and a.num_empty + a.num_cached == a.num_blocks


PrefixMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestPrefixMachine = PrefixMachine.TestCase


def test_a_full_pool_evicts_cached_prefixes_least_recently_released_first() -> None:
    pool = CachedPool(num_blocks=6, budget=64)
    for i, first in enumerate((40, 50, 60)):
        pool.add(f"r{i}", [first + j for j in range(9)], new=1)  # 2 full blocks each
        pool.run()
    a = pool.scheduler.allocator
    assert a.evictions > 0 and a.num_used == 0
    last = pool.add("again", [60 + j for j in range(9)], new=1)
    pool.step()
    assert last.num_cached_tokens == 8  # the newest prefix survived
    first_again = pool.add("first", [40 + j for j in range(9)], new=1)
    pool.run()
    assert first_again.num_cached_tokens == 0  # the oldest was evicted


def test_requests_arriving_together_compute_their_shared_prefix_once() -> None:
    pool = CachedPool(num_blocks=32, budget=64)
    seqs = [pool.add(f"r{i}", [*SYSTEM, 20 + i], new=2) for i in range(4)]
    first = pool.step()
    assert [c.seq for c in first.chunks] == seqs[:1]  # the others wait one step for it
    second = pool.step()
    assert second.cached_tokens == 3 * 8
    assert all(s.num_cached_tokens == 8 for s in seqs[1:])
    pool.run()
