"""Fixed-size KV blocks: a free list, reference counts and the prefix cache. Pure Python.

Every block is in exactly one of three states:
- empty: ref count 0, no content worth keeping, on the free list;
- cached: ref count 0, but it holds the K/V of a full block whose content hash is known
  (`register`): a later sequence with the same prefix takes it back (`lookup` + `acquire`);
- used: ref count ≥ 1 (shared between sequences when > 1; a cached prefix is read-only).
empty + cached + used = total (unit-tested with hypothesis). Allocating takes an empty block
first; when none is left, it evicts the least recently released cached block (its hash is
forgotten). So `num_free`, what can be allocated now, counts empty and cached blocks.
"""

from __future__ import annotations

from collections import OrderedDict, deque

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
        # Prefix cache. _hash_of: every block whose content hash is registered (used or
        # cached); _by_hash: the reverse; _cached: the ref-0 ones, least recently released first.
        self._hash_of: dict[int, bytes] = {}
        self._by_hash: dict[bytes, int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0  # cached blocks given to new content, since start

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now: empty ones and cached ones (evicted on demand)."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached(self) -> int:
        """Unreferenced blocks that still hold a reusable prefix."""
        return len(self._cached)

    @property
    def num_empty(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._cached:
            block, _ = self._cached.popitem(last=False)  # least recently released
            del self._by_hash[self._hash_of.pop(block)]
            self.evictions += 1
        else:
            raise NoFreeBlocks("KV pool exhausted")
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
            if block in self._hash_of:
                self._cached[block] = None  # most recently released: evicted last
            else:
                self._free.append(block)

    def free_all(self, blocks: list[int]) -> None:
        for block in blocks:
            self.free(block)
        blocks.clear()

    # -- the prefix cache ----------------------------------------------------------------

    def register(self, block: int, content: bytes) -> bool:
        """Record that used `block` holds the full block whose chained hash is `content`.

        Returns whether the cache now maps `content` to `block`. It does not when another
        block already holds the same content (two sequences computed it at once): then
        `block` stays private and is emptied when freed. A block has one hash for good.
        """
        self._check(block)
        if self._ref_counts[block] <= 0:
            raise ValueError(f"block {block} is free; only a block in use can be registered")
        known = self._hash_of.get(block)
        if known is not None:
            if known != content:
                raise ValueError(f"block {block} is registered with other content")
            return True
        if content in self._by_hash:
            return False
        self._hash_of[block] = content
        self._by_hash[content] = block
        return True

    def lookup(self, content: bytes) -> int | None:
        """The block holding `content`, in use or cached; None when it is not (or evicted)."""
        return self._by_hash.get(content)

    def acquire(self, block: int) -> int:
        """Take a reference to a registered block found by `lookup`, reviving it if cached."""
        self._check(block)
        if block not in self._hash_of:
            raise ValueError(f"block {block} holds no cached prefix")
        if self._ref_counts[block] == 0:
            del self._cached[block]
        self._ref_counts[block] += 1
        return block

    def drop_cached(self) -> int:
        """Forget every cached prefix nothing holds (their blocks become empty); returns how
        many. Blocks in use keep theirs."""
        count = len(self._cached)
        for block in self._cached:
            del self._by_hash[self._hash_of.pop(block)]
            self._free.append(block)
        self._cached.clear()
        return count

    def is_cached(self, block: int) -> bool:
        """Whether `block` is unreferenced but kept for its prefix (reviving uses a free one)."""
        return block in self._cached
