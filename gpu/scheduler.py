"""Continuous batching: which sequences run in the next step, and how many tokens each.

Pure Python, no torch, no I/O. `schedule()` returns a `ScheduledBatch` value; the runner
computes it and the engine reports back with `advance()`/`finish()`.

Policy, in order, each step:
1. Sequences already running continue (decode one token, or the next chunk of a prefill),
   highest effective priority first; a prefill chunk leaves room in the budget for the
   decodes after it. When a sequence needs a block and none is free, the
   running sequence with the lowest effective priority (ties: the newest) is preempted: its
   blocks are freed and it waits to be recomputed from its tokens so far.
2. Waiting sequences join while the token budget, `max_num_seqs` and free blocks (for the
   whole prompt) allow; a long prompt is split into chunks that share the step with decodes
   (chunked prefill). Nothing joins in a step that had to preempt, so a step never evicts
   what it just admitted.

Effective priority = `priority` + seconds since arrival / `aging_seconds`: a request that has
waited long enough outranks any newcomer, so constant arrivals cannot starve anyone.

With a `prefix_key` (prefix caching on), every full block a step computes is registered in the
allocator under its chained content hash (`gpu.prefix_hash`), and a sequence admitted with
nothing computed first maps the longest run of cached blocks that starts its tokens into its
block table (shared, read-only) and prefills only the rest; at least its last token is always
computed, since sampling needs its logits. Admission counts a cached block as taken only if
nothing else holds it (reviving it uses up a free block). A waiting sequence whose next
uncached block another sequence is computing right now waits for it rather than compute it
again: requests that arrive together with one system prompt compute it once.

With `window` set (every layer of the model attends through a sliding window of that many
positions), blocks no future query can see are released as soon as a step computes past
them: their table entries become `RELEASED_BLOCK` (the pool's zeroed padding block), so a
sequence holds about window / block_size blocks however long it grows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpu.block_allocator import BlockAllocator, blocks_for
from gpu.prefix_hash import extend_hashes
from gpu.sequence import Sequence, SequenceStatus

RELEASED_BLOCK = 0  # gpu.kv_pool.PAD_BLOCK: never handed out, so never a sequence's own


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512  # per-step token budget (prefill chunks + decodes)
    block_size: int = 16
    aging_seconds: float = 10.0  # waiting this long is worth one priority level
    admission_watermark: float = 0.01  # fraction of blocks kept free when admitting
    window: int | None = None  # every layer's sliding window, if all have one: release blocks

    def __post_init__(self) -> None:
        if self.aging_seconds <= 0:
            raise ValueError("aging_seconds must be positive")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0 or self.block_size <= 0:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be positive")
        if self.window is not None and self.window <= 0:
            raise ValueError("window must be positive")


@dataclass(frozen=True)
class ScheduledChunk:
    """`num_tokens` tokens of `seq`, at positions `start` .. `start + num_tokens - 1`.

    `samples` and `is_decode` are fixed when the chunk is scheduled: the sequence grows once
    the step's token is appended, and the chunk must still describe what was computed.
    """

    seq: Sequence
    start: int
    num_tokens: int
    samples: bool  # the chunk reaches the sequence's last token: the step samples the next
    is_decode: bool  # one new token after a computed context

    @classmethod
    def of(cls, seq: Sequence, start: int, num_tokens: int) -> ScheduledChunk:
        end = start + num_tokens
        return cls(
            seq=seq,
            start=start,
            num_tokens=num_tokens,
            samples=end == seq.num_tokens,
            is_decode=num_tokens == 1 and start > 0 and end == seq.num_tokens,
        )

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class ScheduledBatch:
    chunks: tuple[ScheduledChunk, ...]
    preempted: tuple[Sequence, ...] = ()
    # Sequences admitted for the first time this step: their prompt tokens, and how many of
    # those the prefix cache served (the KV hit rate is the ratio over many steps).
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_decode_tokens(self) -> int:
        return sum(1 for c in self.chunks if c.is_decode)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens


@dataclass
class Scheduler:
    config: SchedulerConfig
    allocator: BlockAllocator
    clock: Callable[[], float]
    waiting: list[Sequence] = field(default_factory=list)
    running: list[Sequence] = field(default_factory=list)
    prefix_key: bytes | None = None  # root of the block hash chain; None: no prefix caching

    def __post_init__(self) -> None:
        if self.prefix_key is not None and self.config.window is not None:
            # Released blocks would leave holes in the chain; all-local models do without.
            raise ValueError("prefix caching and block release behind a window do not mix")

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def effective_priority(self, seq: Sequence, now: float) -> float:
        return seq.priority + (now - seq.arrival_time) / self.config.aging_seconds

    def _order(self, seqs: list[Sequence], now: float) -> list[Sequence]:
        # Most urgent first: highest effective priority, then oldest arrival.
        return sorted(seqs, key=lambda s: (-self.effective_priority(s, now), s.arrival_time))

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        return max(blocks_for(num_tokens, self.config.block_size) - len(seq.block_table), 0)

    def schedule(self) -> ScheduledBatch:
        now = self.clock()
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[Sequence] = []
        queue = self._order(self.running, now)

        while queue and budget > 0:
            seq = queue.pop(0)
            n = min(seq.num_uncomputed_tokens, budget)
            if n > 1:
                # A prefill chunk never takes the tokens the decodes still queued need: one
                # long prompt (or a recompute) must not stall everyone else's next token.
                n = min(n, budget - sum(1 for s in queue if s.num_uncomputed_tokens == 1))
            if n <= 0:
                continue
            need = self.blocks_needed(seq, seq.num_computed_tokens + n)
            while need > self.allocator.num_free and queue:
                victim = queue.pop()  # lowest effective priority, newest
                self._preempt(victim)
                preempted.append(victim)
            if need > self.allocator.num_free:
                self._preempt(seq)
                preempted.append(seq)
                continue
            self._allocate(seq, need)
            chunks.append(ScheduledChunk.of(seq, seq.num_computed_tokens, n))
            budget -= n

        prompt = cached = 0
        if not preempted:
            prompt, cached = self._admit(now, budget, chunks)
        return ScheduledBatch(tuple(chunks), tuple(preempted), prompt, cached)

    def _admit(self, now: float, budget: int, chunks: list[ScheduledChunk]) -> tuple[int, int]:
        """Admit waiting sequences into `chunks`; returns (prompt tokens, cached tokens) of
        those admitted for the first time."""
        prompt_tokens = cached_tokens = 0
        watermark = int(self.allocator.num_blocks * self.config.admission_watermark)
        in_flight = self._blocks_in_flight()
        for seq in self._order(self.waiting, now):
            # Keep a little room for running sequences to grow; with none running, a request
            # that needs the whole pool must still get in.
            reserve = watermark if self.running else 0
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            hits = self._cached_prefix(seq)
            if len(seq.block_hashes) > len(hits) and seq.block_hashes[len(hits)] in in_flight:
                continue  # its next block is being computed: it will be a hit next step
            # A cached block nothing holds counts as free until this sequence revives it.
            revived = sum(1 for b in hits if self.allocator.is_cached(b))
            # Admit only when the whole prompt (or recompute) fits: admitting on the first
            # chunk alone lets a long sequence join, then be preempted again at its next chunk.
            new_blocks = self.blocks_needed(seq, seq.num_tokens) - len(hits)
            if new_blocks + revived > self.allocator.num_free - reserve:
                break  # the most urgent waiting request goes first; nothing jumps it
            if hits:
                seq.block_table = [self.allocator.acquire(b) for b in hits]
                seq.num_computed_tokens = seq.num_registered_blocks = len(hits)
                seq.num_computed_tokens *= self.config.block_size
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
                prompt_tokens += seq.num_prompt_tokens
                cached_tokens += seq.num_cached_tokens
            n = min(seq.num_uncomputed_tokens, budget)
            need = self.blocks_needed(seq, seq.num_computed_tokens + n)
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            self._allocate(seq, need)
            chunks.append(ScheduledChunk.of(seq, seq.num_computed_tokens, n))
            budget -= n
            if self.prefix_key is not None:
                in_flight.update(seq.block_hashes[len(hits) :])
        return prompt_tokens, cached_tokens

    def _blocks_in_flight(self) -> set[bytes]:
        """The hashes of full blocks running sequences are prefilling and have not yet
        offered the cache (empty without prefix caching)."""
        if self.prefix_key is None:
            return set()
        pending: set[bytes] = set()
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1:
                full = (seq.num_tokens - 1) // self.config.block_size
                pending.update(self._hashes(seq, full)[seq.num_registered_blocks : full])
        return pending

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks that start `seq`'s tokens, in order (none without caching, or
        when `seq` already holds blocks). Its last token is left to compute."""
        if self.prefix_key is None or seq.block_table or seq.num_computed_tokens:
            return []
        full = (seq.num_tokens - 1) // self.config.block_size
        hashes = self._hashes(seq, full)
        hits: list[int] = []
        for content in hashes[:full]:
            block = self.allocator.lookup(content)
            if block is None:
                break
            hits.append(block)
        return hits

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        assert self.prefix_key is not None
        return extend_hashes(
            seq.block_hashes, self.prefix_key, num_blocks, self.config.block_size, seq.token_slice
        )

    def _register_full_blocks(self, seq: Sequence) -> None:
        """Offer the cache every block of `seq` that is now full and not yet offered."""
        full = min(seq.num_computed_tokens // self.config.block_size, len(seq.block_table))
        if full <= seq.num_registered_blocks:
            return
        hashes = self._hashes(seq, full)
        for index in range(seq.num_registered_blocks, full):
            self.allocator.register(seq.block_table[index], hashes[index])
        seq.num_registered_blocks = full

    def _allocate(self, seq: Sequence, count: int) -> None:
        for _ in range(count):
            block = self.allocator.allocate()
            if block == RELEASED_BLOCK and self.config.window is not None:
                raise RuntimeError(f"block {block} marks released entries: hold it first")
            seq.block_table.append(block)

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks; it waits and is recomputed from its tokens."""
        self._free_table(seq)
        seq.num_computed_tokens = seq.num_registered_blocks = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.running.remove(seq)
        self.waiting.append(seq)

    def advance(self, batch: ScheduledBatch) -> None:
        """Record that the batch's chunks were computed (their K/V are now in the pool)."""
        for chunk in batch.chunks:
            chunk.seq.num_computed_tokens = chunk.end
            if self.prefix_key is not None:
                self._register_full_blocks(chunk.seq)
            if self.config.window is not None:
                self._release_behind_window(chunk.seq, self.config.window)

    def _release_behind_window(self, seq: Sequence, window: int) -> None:
        """Free the blocks wholly before the window of the next query (at num_computed_tokens:
        it sees positions from num_computed_tokens - window + 1 on; later queries see less)."""
        table = seq.block_table
        dead = max(0, seq.num_computed_tokens - window + 1) // self.config.block_size
        for index in range(min(dead, len(table)) - 1, -1, -1):  # newest first: stop at the
            if table[index] == RELEASED_BLOCK:  # ones an earlier step released
                break
            self.allocator.free(table[index])
            table[index] = RELEASED_BLOCK

    def _free_table(self, seq: Sequence) -> None:
        table = seq.block_table
        if self.config.window is not None:  # without one, no entry is ever released
            table = [b for b in table if b != RELEASED_BLOCK]
        self.allocator.free_all(table)
        seq.block_table.clear()

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take a sequence out of the scheduler for good and return its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free_table(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
