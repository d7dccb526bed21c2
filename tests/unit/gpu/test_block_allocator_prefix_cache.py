"""The allocator's prefix cache: register, look up, revive, evict least recently released.

The stateful test drives random allocations, shares, frees, registrations and revivals and
checks that empty + cached + used = total and that a hash never names two blocks.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu.block_allocator import BlockAllocator
from gpu.prefix_hash import block_hash, extend_hashes, root_key


def test_a_released_registered_block_is_cached_and_can_be_revived() -> None:
    a = BlockAllocator(3)
    block = a.allocate()
    assert a.register(block, b"h0")
    a.free(block)
    assert (a.num_empty, a.num_cached, a.num_used, a.num_free) == (2, 1, 0, 3)
    assert a.lookup(b"h0") == block
    assert a.acquire(block) == block
    assert (a.num_cached, a.num_used, a.ref_count(block)) == (0, 1, 1)
    assert a.acquire(block) == block  # a second sequence shares it while in use
    assert a.ref_count(block) == 2


def test_an_unregistered_block_is_emptied_when_freed() -> None:
    a = BlockAllocator(2)
    block = a.allocate()
    a.free(block)
    assert (a.num_empty, a.num_cached) == (2, 0)
    with pytest.raises(ValueError, match="no cached prefix"):
        a.acquire(block)


def test_empty_blocks_go_first_then_the_least_recently_released_cached_one() -> None:
    a = BlockAllocator(3)
    b0, b1, b2 = (a.allocate() for _ in range(3))
    for block, content in ((b0, b"x"), (b1, b"y"), (b2, b"z")):
        a.register(block, content)
    a.free(b1)  # released first: evicted first
    a.free(b0)
    a.free(b2)
    assert a.allocate() == b1
    assert a.lookup(b"y") is None and a.evictions == 1
    assert a.lookup(b"x") == b0 and a.lookup(b"z") == b2
    a.acquire(b0)  # revived, then released again: now the most recent
    a.free(b0)
    assert a.allocate() == b2


def test_the_same_content_registered_twice_keeps_the_first_block() -> None:
    a = BlockAllocator(2)
    first, second = a.allocate(), a.allocate()
    assert a.register(first, b"same")
    assert not a.register(second, b"same")
    assert a.register(first, b"same")  # idempotent
    a.free(second)
    assert a.num_empty == 1  # the duplicate is not kept
    with pytest.raises(ValueError, match="other content"):
        a.register(first, b"different")


def test_dropping_the_cache_empties_cached_blocks_and_keeps_used_ones() -> None:
    a = BlockAllocator(3)
    kept, dropped = a.allocate(), a.allocate()
    a.register(kept, b"kept")
    a.register(dropped, b"dropped")
    a.free(dropped)
    assert a.drop_cached() == 1
    assert (a.num_empty, a.num_cached, a.num_used) == (2, 0, 1)
    assert a.lookup(b"dropped") is None and a.lookup(b"kept") == kept


def test_a_free_block_cannot_be_registered() -> None:
    a = BlockAllocator(1)
    with pytest.raises(ValueError, match="only a block in use"):
        a.register(0, b"h")


def test_hashes_chain_from_the_model() -> None:
    root, other = root_key("sha256:aa", "none", "float32"), root_key("sha256:bb", "none", "float32")
    assert root != other and root != root_key("sha256:aa", "int8", "float32")
    tokens = list(range(12))
    chain = extend_hashes([], root, 3, 4, lambda s, e: tokens[s:e])
    assert len(chain) == 3 and len(set(chain)) == 3
    assert chain[0] == block_hash(root, [0, 1, 2, 3])
    assert chain[1] == block_hash(chain[0], [4, 5, 6, 7])
    # Same block tokens after a different first block: a different hash.
    changed = [99, *tokens[1:]]
    assert extend_hashes([], root, 2, 4, lambda s, e: changed[s:e])[1] != chain[1]
    assert extend_hashes([], other, 1, 4, lambda s, e: tokens[s:e])[0] != chain[0]
    grown = extend_hashes(chain[:1], root, 3, 4, lambda s, e: tokens[s:e])
    assert grown == chain


class CachingAllocatorMachine(RuleBasedStateMachine):
    """References held by a model of the caller; content hashes from a small alphabet."""

    @initialize(num_blocks=st.integers(1, 8))
    def make(self, num_blocks: int) -> None:
        self.a = BlockAllocator(num_blocks)
        self.held: dict[int, int] = {}  # block -> references the test holds
        self.content: dict[int, bytes] = {}  # registered block -> its hash, as the test saw it

    def _take(self, block: int) -> None:
        self.held[block] = self.held.get(block, 0) + 1

    @precondition(lambda self: self.a.num_free > 0)
    @rule()
    def allocate(self) -> None:
        block = self.a.allocate()
        assert block not in self.held
        self.content.pop(block, None)  # evicted, if it was cached
        self._take(block)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from(sorted(self.held)))
        self._take(self.a.share(block))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from(sorted(self.held)))
        self.a.free(block)
        self.held[block] -= 1
        if not self.held[block]:
            del self.held[block]

    @precondition(lambda self: self.held)
    @rule(data=st.data(), content=st.sampled_from([b"a", b"b", b"c", b"d"]))
    def register(self, data: st.DataObject, content: bytes) -> None:
        block = data.draw(st.sampled_from(sorted(self.held)))
        if block in self.content and self.content[block] != content:
            with pytest.raises(ValueError):
                self.a.register(block, content)
            return
        taken = content in self.content.values() and self.content.get(block) != content
        assert self.a.register(block, content) is not taken
        if not taken:
            self.content[block] = content

    @rule(content=st.sampled_from([b"a", b"b", b"c", b"d"]))
    def revive(self, content: bytes) -> None:
        block = self.a.lookup(content)
        owners = [b for b, c in self.content.items() if c == content]
        assert owners == ([block] if block is not None else [])
        if block is not None:
            self.a.acquire(block)
            self._take(block)

    @invariant()
    def blocks_are_conserved(self) -> None:
        a = self.a
        assert a.num_empty + a.num_cached + a.num_used == a.num_blocks
        assert a.num_used == len(self.held)
        for block in range(a.num_blocks):
            assert a.ref_count(block) == self.held.get(block, 0)
            assert a.is_cached(block) == (block in self.content and block not in self.held)


CachingAllocatorMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestCachingAllocatorMachine = CachingAllocatorMachine.TestCase
