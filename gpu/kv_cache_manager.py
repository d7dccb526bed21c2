"""Each sequence's KV blocks: its block table over the allocator, prefix caching, window release.

Pure Python, no torch, no I/O. The scheduler decides who runs and how many tokens; it asks this
manager whether blocks are there (`can_allocate`), takes them (`allocate`, `take_prefix`),
reports progress (`computed`) and gives them back (`free`). The manager is the one writer of
`Sequence.block_table` (entry i holds positions i * block_size ..; the backend reads it).

With a `prefix_key` (prefix caching on), the manager keeps each sequence's chained block
hashes (`gpu.prefix_hash`) and offers the allocator's cache every full block a step computes.
`cached_prefix` finds the longest run of cached blocks that starts a sequence holding nothing,
leaving at least its last token to compute (sampling needs its logits). `blocks_in_flight`
names the full blocks sequences are computing right now and have not yet offered: a newcomer
whose next block is among them waits a step and then finds it cached.

With `window` (every layer attends through a sliding window of that many positions), the
blocks no future query can see are released as soon as a step computes past them: their table
entries become `RELEASED_BLOCK` (the pool's zeroed padding block, which the engine holds for
good), so a sequence holds about window / block_size blocks however long it grows. Released
blocks would leave holes in the hash chain, so the two do not mix.

Made to grow into (nothing of the engine uses them yet):
- `n` > 1 sampling: `fork` gives a child the parent's computed blocks by reference count and
  copies the partly written last block (copy-on-write, done eagerly: both will write there);
- speculative decoding: `allocate` the k draft slots with the rest, then `trim` the table back
  to the accepted tokens;
- an encoder pass keeps no K/V: such a sequence never asks for blocks and holds no table.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from gpu.block_allocator import BlockAllocator, blocks_for
from gpu.prefix_hash import extend_hashes
from gpu.sequence import Sequence

RELEASED_BLOCK = 0  # gpu.kv_pool.PAD_BLOCK: never handed out, so never a sequence's own


@dataclass
class _Hashes:
    """What the prefix cache knows of one sequence."""

    chain: list[bytes] = field(default_factory=list)  # its full blocks' hashes, block 0 on
    registered: int = 0  # leading table entries offered to the cache


class KVCacheManager:
    """The block tables of one scheduler's sequences over `allocator` (see the module)."""

    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int,
        prefix_key: bytes | None = None,
        window: int | None = None,
    ) -> None:
        if prefix_key is not None and window is not None:
            raise ValueError("prefix caching and block release behind a window do not mix")
        self.allocator = allocator
        self.block_size = block_size
        self.prefix_key = prefix_key  # root of the block hash chain; None: no prefix caching
        self.window = window
        # Every sequence the prefix cache has hashed (waiting or holding blocks), until `free`.
        self._hashes: dict[Sequence, _Hashes] = {}

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    # -- growing and shrinking tables ------------------------------------------------------

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks `seq`'s table needs to cover positions 0 .. num_tokens - 1."""
        return max(blocks_for(num_tokens, self.block_size) - len(seq.block_table), 0)

    def can_allocate(
        self, seq: Sequence, num_tokens: int, *, prefix: Collection[int] = (), reserve: int = 0
    ) -> bool:
        """Whether `allocate(seq, num_tokens)` fits in the free pool less `reserve` blocks,
        after `take_prefix(seq, prefix)`: a cached block nothing holds counts as taken (reviving
        it uses up a free one), one another sequence holds does not."""
        revived = sum(1 for b in prefix if self.allocator.is_cached(b))
        need = self.blocks_needed(seq, num_tokens) - len(prefix) + revived
        return need <= self.allocator.num_free - reserve

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq`'s table to cover positions 0 .. num_tokens - 1 (raises NoFreeBlocks when
        the pool runs out: ask `can_allocate` first)."""
        if self.prefix_key is not None:
            self._hashes.setdefault(seq, _Hashes())  # holding blocks: `blocks_in_flight` sees it
        for _ in range(self.blocks_needed(seq, num_tokens)):
            block = self.allocator.allocate()
            if block == RELEASED_BLOCK and self.window is not None:
                raise RuntimeError(f"block {block} marks released entries: hold it first")
            seq.block_table.append(block)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Shrink `seq`'s table to the blocks covering its first `num_tokens` positions (the
        rest go back to the pool): what a rejected speculative draft leaves; the caller sets
        `num_computed_tokens` to at most `num_tokens`. The cut may not fall inside a block that
        is read-only (shared, offered to the prefix cache, or released): it is written again."""
        table = seq.block_table
        keep = blocks_for(num_tokens, self.block_size)
        if num_tokens < 0 or keep > len(table):
            raise ValueError(f"cannot trim {seq.request_id} to {num_tokens} tokens")
        state = self._hashes.get(seq, _Hashes())
        if num_tokens % self.block_size:  # positions num_tokens .. of table[keep - 1] change
            last = table[keep - 1]
            if (
                state.registered >= keep
                or self._released(last)
                or self.allocator.ref_count(last) > 1
            ):
                raise ValueError(
                    f"{seq.request_id}: block {last} is read-only; cannot trim into it"
                )
        state.registered = min(state.registered, keep)
        del state.chain[num_tokens // self.block_size :]  # the tokens after may change
        dropped = table[keep:]
        del table[keep:]
        self.allocator.free_all([b for b in dropped if not self._released(b)])

    def free(self, seq: Sequence) -> None:
        """Give back every block `seq` holds (preempted or finished) and forget its hashes."""
        self.allocator.free_all([b for b in seq.block_table if not self._released(b)])
        seq.block_table.clear()
        self._hashes.pop(seq, None)

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int]]:
        """Give `child` (holding nothing, same tokens as `parent` so far) `parent`'s computed
        K/V: the blocks it has wholly computed are shared by reference count; its partly
        computed last block is copied into a fresh block of `child`'s, since both will write
        there. The caller then sets `child.num_computed_tokens` and makes the returned copies,
        (source block, destination block), in the pool before the next step. Raises
        NoFreeBlocks, holding nothing, when no block is free for the copy."""
        if child.block_table:
            raise ValueError(f"{child.request_id} already holds blocks")
        full, partial = divmod(parent.num_computed_tokens, self.block_size)
        copies = [(parent.block_table[full], self.allocator.allocate())] if partial else []
        shared = parent.block_table[:full]
        child.block_table.extend(
            b if self._released(b) else self.allocator.share(b) for b in shared
        )
        child.block_table.extend(dst for _, dst in copies)
        state = self._hashes.get(parent)
        if state is not None:
            self._hashes[child] = _Hashes(state.chain[:full], min(state.registered, full))
        return copies

    def _released(self, block: int) -> bool:
        return block == RELEASED_BLOCK and self.window is not None  # without, 0 may be one's own

    # -- progress ----------------------------------------------------------------------------

    def computed(self, seq: Sequence) -> None:
        """`seq.num_computed_tokens` moved on (a step computed a chunk): offer the cache its
        newly full blocks, release the blocks now wholly behind the window."""
        if self.prefix_key is not None:
            self._register_full_blocks(seq)
        if self.window is not None:
            self._release_behind_window(seq, self.window)

    def _register_full_blocks(self, seq: Sequence) -> None:
        """Offer the cache every block of `seq` that is now full and not yet offered."""
        state = self._hashes.setdefault(seq, _Hashes())
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= state.registered:
            return
        hashes = self._chain(seq, full)
        for index in range(state.registered, full):
            self.allocator.register(seq.block_table[index], hashes[index])
        state.registered = full

    def _release_behind_window(self, seq: Sequence, window: int) -> None:
        """Free the blocks wholly before the window of the next query (at num_computed_tokens:
        it sees positions from num_computed_tokens - window + 1 on; later queries see less)."""
        table = seq.block_table
        dead = max(0, seq.num_computed_tokens - window + 1) // self.block_size
        for index in range(min(dead, len(table)) - 1, -1, -1):  # newest first: stop at the
            if table[index] == RELEASED_BLOCK:  # ones an earlier step released
                break
            self.allocator.free(table[index])
            table[index] = RELEASED_BLOCK

    # -- the prefix cache ------------------------------------------------------------------

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks that start `seq`'s tokens, in order (none without caching, or
        when `seq` already holds blocks). Its last token is left to compute. None either for
        a sequence still scoring its prompt (`Sequence.scores_prompt`): a cached block has no
        logits, so it computes its prompt again (the blocks it computes are still cached)."""
        if self.prefix_key is None or seq.block_table or seq.num_computed_tokens:
            return []
        if seq.scores_prompt:
            return []
        full = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for content in self._chain(seq, full)[:full]:
            block = self.allocator.lookup(content)
            if block is None:
                break
            hits.append(block)
        return hits

    def take_prefix(self, seq: Sequence, hits: list[int]) -> int:
        """Map `cached_prefix(seq)`'s blocks into `seq`'s (empty) table; returns how many of its
        tokens they hold, now computed."""
        seq.block_table.extend(self.allocator.acquire(b) for b in hits)
        self._hashes.setdefault(seq, _Hashes()).registered = len(hits)
        return len(hits) * self.block_size

    def blocks_in_flight(self) -> set[bytes]:
        """The hashes of full blocks sequences holding blocks are prefilling and have not yet
        offered the cache (empty without prefix caching)."""
        pending: set[bytes] = set()
        for seq in self._hashes:
            pending.update(self.hashes_in_flight(seq))
        return pending

    def hashes_in_flight(self, seq: Sequence) -> list[bytes]:
        """`blocks_in_flight` for one sequence."""
        if self.prefix_key is None or not seq.block_table or seq.num_uncomputed_tokens <= 1:
            return []
        full = (seq.num_tokens - 1) // self.block_size
        chain = self._chain(seq, full)
        return chain[self._hashes[seq].registered : full]

    def waits_for(self, seq: Sequence, hits: list[int], in_flight: set[bytes]) -> bool:
        """Whether the full block after `seq`'s cached prefix `hits` is in `in_flight`: another
        sequence is computing it, and it will be a hit next step."""
        state = self._hashes.get(seq)
        chain = state.chain if state is not None else []
        return len(chain) > len(hits) and chain[len(hits)] in in_flight

    def _chain(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        assert self.prefix_key is not None
        state = self._hashes.setdefault(seq, _Hashes())
        return extend_hashes(
            state.chain, self.prefix_key, num_blocks, self.block_size, seq.token_slice
        )
