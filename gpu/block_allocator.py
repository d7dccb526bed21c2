"""Fixed-size KV blocks: a free list and reference counts. Pure Python.

Invariant (unit-tested): every block is either free (ref count 0, on the free list exactly
once) or in use (ref count ≥ 1); free + used = total.
"""

from __future__ import annotations

from collections import deque

from gpu.errors import NoFreeBlocks

__all__ = ["BlockAllocator", "NoFreeBlocks"]


def blocks_for(num_tokens: int, block_size: int) -> int:
    """How many blocks hold `num_tokens` tokens."""
    return -(-num_tokens // block_size)


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("a KV pool needs at least one block")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def allocate(self) -> int:
        if not self._free:
            raise NoFreeBlocks("KV pool exhausted")
        block = self._free.popleft()
        self._ref_counts[block] = 1
        return block

    def _check(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} is not in the pool [0, {self.num_blocks})")

    def share(self, block: int) -> int:
        """Take one more reference to a block in use (a shared prefix, a forked sequence)."""
        self._check(block)
        if self._ref_counts[block] <= 0:
            raise ValueError(f"block {block} is free; cannot share it")
        self._ref_counts[block] += 1
        return block

    def free(self, block: int) -> None:
        self._check(block)
        count = self._ref_counts[block]
        if count <= 0:
            raise ValueError(f"block {block} freed twice")
        self._ref_counts[block] = count - 1
        if count == 1:
            self._free.append(block)

    def free_all(self, blocks: list[int]) -> None:
        for block in blocks:
            self.free(block)
        blocks.clear()
