"""The KV-cache manager alone, over a real allocator and a simulated pool.

The pool records, for every slot a step writes, the token prefix that produced it (the K/V of
position p depend on tokens 0..p). Before a chunk computes, every position it attends to must
hold its own sequence's prefix in a block the sequence still holds: a cache hit that maps the
wrong block, a write into a shared block, a fork that skipped its copy, or a window release
that freed a block a query still sees shows up as a mismatch.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu.block_allocator import BlockAllocator, NoFreeBlocks, blocks_for
from gpu.kv_cache_manager import RELEASED_BLOCK, KVCacheManager
from gpu.prefix_hash import root_key
from gpu.sequence import SamplingParams, Sequence

ROOT = root_key("sha256:test", "none", "float32")
SYSTEM = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
TOKEN = st.integers(1, 3)  # a tiny alphabet: prefixes repeat


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(), arrival_time=0.0)


def held(m: KVCacheManager, seqs: list[Sequence], reserved: int = 0) -> None:
    """Every block of every table is referenced, once per table entry that holds it."""
    a = m.allocator
    assert a.num_empty + a.num_cached + a.num_used == a.num_blocks
    owners: dict[int, int] = {}
    for q in seqs:
        for block in q.block_table:
            if not (m.window is not None and block == RELEASED_BLOCK):
                owners[block] = owners.get(block, 0) + 1
    assert a.num_used == len(owners) + reserved
    for block, count in owners.items():
        assert a.ref_count(block) == count, block


# -- examples ------------------------------------------------------------------------------


def test_allocate_grows_the_table_to_cover_the_tokens_and_free_gives_it_back() -> None:
    m = KVCacheManager(BlockAllocator(4), block_size=4)
    s = seq("a", list(range(9)))
    assert m.blocks_needed(s, 9) == 3 and m.can_allocate(s, 9)
    m.allocate(s, 9)
    assert len(s.block_table) == 3 and m.blocks_needed(s, 12) == 0
    assert m.can_allocate(s, 16) and not m.can_allocate(s, 17)
    assert not m.can_allocate(s, 13, reserve=1)
    m.free(s)
    assert s.block_table == [] and m.num_free == 4


def test_prefix_caching_and_window_release_do_not_mix() -> None:
    with pytest.raises(ValueError, match="do not mix"):
        KVCacheManager(BlockAllocator(4), 4, prefix_key=ROOT, window=8)


def test_with_a_window_the_released_marker_must_be_held_before_any_allocation() -> None:
    m = KVCacheManager(BlockAllocator(4), 4, window=8)
    with pytest.raises(RuntimeError, match="hold it first"):
        m.allocate(seq("a", [1, 2]), 2)


def test_a_cached_prefix_is_shared_and_counts_as_taken_only_when_nothing_holds_it() -> None:
    m = KVCacheManager(BlockAllocator(6), block_size=4, prefix_key=ROOT)
    a = seq("a", [*SYSTEM, 1])
    assert m.cached_prefix(a) == []
    m.allocate(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    m.computed(a)
    b = seq("b", [*SYSTEM, 2])
    hits = m.cached_prefix(b)
    assert hits == a.block_table[:2]
    # 3 blocks for b's 11 tokens, 2 of them a's (held): 1 from the pool of 3.
    assert m.can_allocate(b, b.num_tokens, prefix=hits, reserve=2)
    assert not m.can_allocate(b, b.num_tokens, prefix=hits, reserve=3)
    m.free(a)  # its registered blocks stay cached: reviving them takes from the pool too
    assert m.can_allocate(b, b.num_tokens, prefix=hits, reserve=3)
    assert not m.can_allocate(b, b.num_tokens, prefix=hits, reserve=4)
    assert m.take_prefix(b, hits) == 8
    b.num_computed_tokens = 8
    m.allocate(b, b.num_tokens)
    assert b.block_table[:2] == hits and m.allocator.ref_count(hits[0]) == 1
    held(m, [b])


def test_a_newcomer_waits_for_the_block_another_sequence_is_computing() -> None:
    m = KVCacheManager(BlockAllocator(8), block_size=4, prefix_key=ROOT)
    first, second = seq("a", [*SYSTEM, 1]), seq("b", [*SYSTEM, 2])
    assert m.cached_prefix(first) == [] and m.blocks_in_flight() == set()
    m.allocate(first, 4)  # its first chunk: 4 of 11 tokens
    in_flight = m.blocks_in_flight()
    assert set(m.hashes_in_flight(first)) == in_flight and len(in_flight) == 2
    assert m.cached_prefix(second) == [] and m.waits_for(second, [], in_flight)
    first.num_computed_tokens = 11
    m.allocate(first, 11)
    m.computed(first)
    assert m.blocks_in_flight() == set()  # offered to the cache: now a hit
    assert m.cached_prefix(second) == first.block_table[:2]


def test_fork_shares_computed_blocks_and_copies_the_partly_written_last_one() -> None:
    m = KVCacheManager(BlockAllocator(8), block_size=4)
    parent = seq("p", list(range(10)))
    m.allocate(parent, 10)
    parent.num_computed_tokens = 10
    child = seq("c", list(range(10)))
    copies = m.fork(parent, child)
    assert child.block_table[:2] == parent.block_table[:2]
    assert copies == [(parent.block_table[2], child.block_table[2])]
    assert child.block_table[2] != parent.block_table[2]
    held(m, [parent, child])
    with pytest.raises(ValueError, match="read-only"):
        m.trim(parent, 6)  # block 1 is the child's too
    m.free(parent)
    held(m, [child])
    aligned = seq("d", list(range(8)))
    m.allocate(aligned, 8)
    aligned.num_computed_tokens = 8
    assert m.fork(aligned, seq("e", list(range(8)))) == []  # nothing partial: nothing to copy


def test_fork_without_a_free_block_for_the_copy_takes_nothing() -> None:
    m = KVCacheManager(BlockAllocator(2), block_size=4)
    parent = seq("p", list(range(6)))
    m.allocate(parent, 6)
    parent.num_computed_tokens = 6
    child = seq("c", list(range(6)))
    with pytest.raises(NoFreeBlocks):
        m.fork(parent, child)
    assert child.block_table == []
    held(m, [parent, child])


def test_trim_drops_the_draft_blocks_but_never_cuts_into_a_read_only_block() -> None:
    m = KVCacheManager(BlockAllocator(8), block_size=4, prefix_key=ROOT)
    s = seq("a", list(range(6)))
    m.allocate(s, 6 + 7)  # a token and six draft slots past it
    assert len(s.block_table) == 4
    m.trim(s, 7)  # two drafts accepted
    assert len(s.block_table) == 2 and m.num_free == 6
    s.num_computed_tokens = 7
    m.computed(s)  # block 0 is full: offered to the cache
    with pytest.raises(ValueError, match="read-only"):
        m.trim(s, 3)
    m.trim(s, 4)  # at a block's edge: block 0 is kept as it is
    assert len(s.block_table) == 1
    with pytest.raises(ValueError, match="cannot trim"):
        m.trim(s, 5)
    held(m, [s])


def test_a_trim_back_past_cached_blocks_offers_the_new_ones_again() -> None:
    m = KVCacheManager(BlockAllocator(8), block_size=4, prefix_key=ROOT)
    s = seq("a", [1, 2, 3, 4])
    s.output_token_ids = [5, 6, 7, 8, 9]
    m.allocate(s, 9)
    s.num_computed_tokens = 8
    m.computed(s)  # blocks 0 and 1 offered
    del s.output_token_ids[:]  # every output rejected (a trim at a block's edge)
    m.trim(s, 4)
    s.output_token_ids = [1, 1, 1, 1, 1]
    m.allocate(s, 9)
    s.num_computed_tokens = 8
    m.computed(s)
    again = seq("b", [1, 2, 3, 4, 1, 1, 1, 1, 1])
    assert m.cached_prefix(again) == s.block_table[:2]


def test_a_child_forked_mid_prefill_offers_its_own_blocks_under_its_own_hashes() -> None:
    m = KVCacheManager(BlockAllocator(8), block_size=4, prefix_key=ROOT)
    parent = seq("p", list(range(1, 13)))
    assert m.cached_prefix(parent) == []  # hashes its blocks 0 and 1
    m.allocate(parent, 12)
    parent.num_computed_tokens = 5
    m.computed(parent)
    child = seq("c", [*range(1, 6), 20, 21, 22, 23])
    assert len(m.fork(parent, child)) == 1
    child.num_computed_tokens = 5
    m.allocate(child, 9)
    child.num_computed_tokens = 9
    m.computed(child)  # its block 1 holds 5, 20, 21, 22
    assert m.cached_prefix(seq("x", list(range(1, 10)))) == parent.block_table[:1]
    assert m.cached_prefix(seq("y", child.token_slice(0, 9))) == child.block_table[:2]


# -- properties ----------------------------------------------------------------------------


class KVMachine(RuleBasedStateMachine):
    """Arrivals, admission (with cached prefixes), chunks, speculative drafts trimmed back,
    forks and frees, in any order, over a small pool; three modes: plain, prefix caching, and
    release behind a sliding window."""

    @initialize(
        num_blocks=st.integers(3, 14),
        block_size=st.integers(1, 4),
        mode=st.sampled_from(["plain", "prefix", "window"]),
        window=st.integers(1, 6),
    )
    def make(self, num_blocks: int, block_size: int, mode: str, window: int) -> None:
        allocator = BlockAllocator(num_blocks)
        self.reserved = 0
        if mode == "window":
            assert allocator.allocate() == RELEASED_BLOCK  # held, as the engine's padding is
            self.reserved = 1
        self.m = KVCacheManager(
            allocator,
            block_size,
            prefix_key=ROOT if mode == "prefix" else None,
            window=window if mode == "window" else None,
        )
        self.bs = block_size
        self.slots: dict[int, tuple[int, ...]] = {}  # flat slot -> prefix whose K/V it holds
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.count = 0
        self.known = [[], SYSTEM, SYSTEM[:4], [3] * 9]  # prompts' starts, and every sequence's

    def new_seq(self, tokens: list[int]) -> Sequence:
        self.count += 1
        return seq(f"r{self.count}", tokens)

    def sees(self, q: Sequence, start: int) -> range:
        """The positions a query at `start` attends to (before it, within the window)."""
        window = self.m.window
        return range(0 if window is None else max(0, start - window + 1), start)

    def check_reads(self, q: Sequence) -> None:
        tokens = q.token_slice(0, q.num_tokens)
        for p in self.sees(q, q.num_computed_tokens):
            block = q.block_table[p // self.bs]
            assert not (self.m.window is not None and block == RELEASED_BLOCK), (q, p)
            assert self.slots.get(block * self.bs + p % self.bs) == tuple(tokens[: p + 1]), p

    def write(self, q: Sequence, start: int, end: int) -> None:
        tokens = q.token_slice(0, q.num_tokens)
        for p in range(start, end):
            block = q.block_table[p // self.bs]
            assert self.m.allocator.ref_count(block) == 1, "a step writes into a shared block"
            self.slots[block * self.bs + p % self.bs] = tuple(tokens[: p + 1])

    @rule(data=st.data(), tail=st.lists(TOKEN, min_size=1, max_size=6))
    def arrive(self, data: st.DataObject, tail: list[int]) -> None:
        """A new prompt: a known one's start (often a computed sequence's: a cache hit) and a
        tail of its own."""
        known = data.draw(st.sampled_from(self.known))
        prefix = known[: data.draw(st.just(len(known)) | st.integers(0, len(known)))]
        self.waiting.append(self.new_seq(prefix + tail))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        q = data.draw(st.sampled_from(self.waiting))
        hits = self.m.cached_prefix(q)
        if not self.m.can_allocate(q, q.num_tokens, prefix=hits):
            return
        free = self.m.num_free
        revived = sum(self.m.allocator.is_cached(b) for b in hits)
        if hits:
            q.num_computed_tokens = self.m.take_prefix(q, hits)
        assert self.m.num_free == free - revived
        self.m.allocate(q, q.num_tokens)
        self.waiting.remove(q)
        self.running.append(q)
        self.check_reads(q)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """Compute a chunk of every running sequence that gets its blocks."""
        for q in list(self.running):
            start = q.num_computed_tokens
            end = data.draw(st.integers(start + 1, q.num_tokens))
            # At its end, a chunk verifies draft tokens too; some are kept, and a token sampled.
            drafts = data.draw(st.integers(0, 3)) if end == q.num_tokens else 0
            if not self.m.can_allocate(q, end + drafts):
                continue
            self.m.allocate(q, end + drafts)
            self.check_reads(q)
            q.output_token_ids.extend(data.draw(st.lists(TOKEN, min_size=drafts, max_size=drafts)))
            self.write(q, start, end + drafts)
            kept = data.draw(st.integers(0, drafts))
            del q.output_token_ids[q.num_tokens - (drafts - kept) :]
            self.m.trim(q, end + kept)
            q.num_computed_tokens = end + kept
            self.m.computed(q)
            if q.num_computed_tokens == q.num_tokens:
                q.output_token_ids.append(data.draw(TOKEN))
            self.known.append(q.token_slice(0, q.num_tokens))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), sampled=TOKEN)
    def fork(self, data: st.DataObject, sampled: int) -> None:
        parent = data.draw(st.sampled_from(self.running))
        if parent.num_computed_tokens == 0 or self.m.num_free == 0:
            return
        tokens = [*parent.token_slice(0, parent.num_computed_tokens), sampled]
        child = self.new_seq(tokens)
        for src, dst in self.m.fork(parent, child):
            for offset in range(self.bs):
                if (old := self.slots.get(src * self.bs + offset)) is not None:
                    self.slots[dst * self.bs + offset] = old
        child.num_computed_tokens = parent.num_computed_tokens
        self.running.append(child)
        self.check_reads(child)

    @precondition(lambda self: self.running or self.waiting)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        q = data.draw(st.sampled_from(self.running + self.waiting))
        self.m.free(q)
        assert q.block_table == []
        (self.running if q in self.running else self.waiting).remove(q)

    @invariant()
    def blocks_are_conserved(self) -> None:
        if not hasattr(self, "m"):
            return
        held(self.m, self.running + self.waiting, self.reserved)
        for q in self.waiting:
            assert q.block_table == []
        for q in self.running:
            assert len(q.block_table) >= blocks_for(q.num_computed_tokens, self.bs)
            if self.m.window is not None:  # released: exactly what no future query sees
                dead = max(0, q.num_computed_tokens - self.m.window + 1) // self.bs
                assert q.block_table[:dead] == [RELEASED_BLOCK] * dead
                assert RELEASED_BLOCK not in q.block_table[dead:]

    def teardown(self) -> None:
        if hasattr(self, "m"):
            for q in self.running + self.waiting:
                self.m.free(q)
            a = self.m.allocator
            assert a.num_used == self.reserved
            assert a.num_empty + a.num_cached == a.num_blocks - self.reserved


KVMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestKVMachine = KVMachine.TestCase
