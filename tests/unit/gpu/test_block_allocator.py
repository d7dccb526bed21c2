"""The block allocator: free + used = total, reference counts, and misuse that must raise."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from gpu.block_allocator import BlockAllocator, NoFreeBlocks
from gpu.errors import EngineError


def test_a_new_pool_is_all_free() -> None:
    allocator = BlockAllocator(4)
    assert allocator.num_free == 4
    assert allocator.num_used == 0
    assert [allocator.ref_count(b) for b in range(4)] == [0, 0, 0, 0]


@pytest.mark.parametrize("num_blocks", [0, -1])
def test_an_empty_pool_is_refused(num_blocks: int) -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockAllocator(num_blocks)


def test_allocate_hands_out_distinct_blocks_until_empty() -> None:
    allocator = BlockAllocator(3)
    blocks = [allocator.allocate() for _ in range(3)]
    assert sorted(blocks) == [0, 1, 2]
    assert all(allocator.ref_count(b) == 1 for b in blocks)
    assert (allocator.num_free, allocator.num_used) == (0, 3)
    with pytest.raises(NoFreeBlocks):
        allocator.allocate()


def test_no_free_blocks_is_an_engine_error() -> None:
    assert issubclass(NoFreeBlocks, EngineError)


def test_a_shared_block_is_free_only_after_its_last_reference() -> None:
    allocator = BlockAllocator(2)
    block = allocator.allocate()
    assert allocator.share(block) == block
    assert allocator.ref_count(block) == 2
    allocator.free(block)
    assert allocator.ref_count(block) == 1
    assert allocator.num_used == 1
    allocator.free(block)
    assert allocator.ref_count(block) == 0
    assert allocator.num_used == 0


def test_double_free_raises() -> None:
    allocator = BlockAllocator(2)
    block = allocator.allocate()
    allocator.free(block)
    with pytest.raises(ValueError, match="freed twice"):
        allocator.free(block)
    assert allocator.num_free == 2  # the failed free changed nothing


def test_freeing_a_never_allocated_block_raises() -> None:
    allocator = BlockAllocator(2)
    with pytest.raises(ValueError, match="freed twice"):
        allocator.free(1)


def test_sharing_a_free_block_raises() -> None:
    allocator = BlockAllocator(2)
    with pytest.raises(ValueError, match="is free"):
        allocator.share(0)


def test_free_all_returns_every_block_and_empties_the_table() -> None:
    allocator = BlockAllocator(4)
    table = [allocator.allocate() for _ in range(4)]
    allocator.free_all(table)
    assert table == []
    assert allocator.num_free == 4
    assert allocator.num_used == 0
    # Every block can be handed out again, each exactly once.
    assert sorted(allocator.allocate() for _ in range(4)) == [0, 1, 2, 3]


def test_free_all_drops_one_reference_of_shared_blocks() -> None:
    allocator = BlockAllocator(3)
    a = [allocator.allocate(), allocator.allocate()]
    b = [allocator.share(a[0]), allocator.allocate()]
    allocator.free_all(a)
    assert allocator.ref_count(b[0]) == 1  # still held by b
    assert allocator.num_used == 2
    allocator.free_all(b)
    assert allocator.num_used == 0


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate / share / free / free_all against a model of who holds which block."""

    refs = Bundle("refs")  # one entry per reference held

    @initialize(num_blocks=st.integers(1, 8))
    def make(self, num_blocks: int) -> None:
        self.allocator = BlockAllocator(num_blocks)
        self.held: dict[int, int] = {}  # block -> references held by the test

    def _take(self, block: int) -> int:
        self.held[block] = self.held.get(block, 0) + 1
        return block

    def _drop(self, block: int) -> None:
        self.held[block] -= 1
        if not self.held[block]:
            del self.held[block]

    @precondition(lambda self: self.allocator.num_free > 0)
    @rule(target=refs)
    def allocate(self) -> int:
        block = self.allocator.allocate()
        assert block not in self.held, "allocate handed out a block in use"
        return self._take(block)

    @precondition(lambda self: self.allocator.num_free == 0)
    @rule()
    def allocate_on_empty_raises(self) -> None:
        with pytest.raises(NoFreeBlocks):
            self.allocator.allocate()

    @rule(target=refs, block=refs)
    def share(self, block: int) -> int:
        # `refs` may name a block whose references were all dropped; then share must refuse.
        if block in self.held:
            return self._take(self.allocator.share(block))
        with pytest.raises(ValueError):
            self.allocator.share(block)
        return block

    @rule(block=consumes(refs))
    def free(self, block: int) -> None:
        if block in self.held:
            self.allocator.free(block)
            self._drop(block)
        else:
            with pytest.raises(ValueError, match="freed twice"):
                self.allocator.free(block)

    @rule(blocks=st.lists(consumes(refs), max_size=4, unique=True))
    def free_all(self, blocks: list[int]) -> None:
        table = [b for b in blocks if b in self.held]
        self.allocator.free_all(table)
        assert table == []
        for block in blocks:
            if block in self.held:
                self._drop(block)

    @invariant()
    def free_plus_used_is_total(self) -> None:
        a = self.allocator
        assert a.num_free + a.num_used == a.num_blocks
        assert a.num_used == len(self.held)

    @invariant()
    def ref_counts_match_references_held(self) -> None:
        for block in range(self.allocator.num_blocks):
            assert self.allocator.ref_count(block) == self.held.get(block, 0)

    @invariant()
    def free_list_holds_each_free_block_once(self) -> None:
        free = list(self.allocator._free)
        assert sorted(free) == sorted(set(range(self.allocator.num_blocks)) - self.held.keys())


AllocatorMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestAllocatorMachine = AllocatorMachine.TestCase
