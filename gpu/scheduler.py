"""Continuous batching: which sequences run in the next step, and how many tokens each.

Pure Python, no torch, no I/O. `schedule()` returns a `ScheduledBatch` value; the backend
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

Blocks are the KV-cache manager's (`gpu.kv_cache_manager`): the scheduler asks it whether a
chunk's blocks are there, takes them, and gives them back on preemption and finish. With a
`prefix_key` (prefix caching on), a sequence admitted with nothing computed first takes the
longest run of cached blocks that starts its tokens and prefills only the rest; admission
counts a cached block as taken only if nothing else holds it (reviving it uses up a free
block). A waiting sequence whose next uncached block another sequence is computing right now
waits for it rather than compute it again: requests that arrive together with one system
prompt compute it once. With `window` set, the manager releases blocks behind the window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpu.block_allocator import BlockAllocator
from gpu.kv_cache_manager import RELEASED_BLOCK, KVCacheManager
from gpu.sequence import Sequence, SequenceStatus

__all__ = [
    "RELEASED_BLOCK",  # where tests and the engine have always found it
    "ScheduledBatch",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
]


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

    A verify chunk (speculative decoding) ends with `draft`: tokens guessed after the
    sequence's last one, which are not (yet) its tokens. Its forward writes their K/V and
    samples at each of its last `1 + len(draft)` positions; the engine keeps the guesses the
    samples agree with (`gpu.speculative.verify`) and `Scheduler.advance` discards the rest.
    """

    seq: Sequence
    start: int
    num_tokens: int  # the drafted tokens included
    samples: bool  # the chunk reaches the sequence's last token: the step samples the next
    # (not for a request with max_new_tokens 0: it only scores its prompt)
    is_decode: bool  # one new token after a computed context (no draft)
    draft: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, seq: Sequence, start: int, num_tokens: int, draft: tuple[int, ...] = ()
    ) -> ScheduledChunk:
        end = start + num_tokens
        samples = end - len(draft) == seq.num_tokens and seq.params.max_new_tokens > 0
        return cls(
            seq=seq,
            start=start,
            num_tokens=num_tokens,
            samples=samples,
            is_decode=num_tokens == 1 and start > 0 and samples,
            draft=draft,
        )

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def num_sampled(self) -> int:
        """Rows of the step's logits this chunk samples: its last token's and each guess's."""
        return 1 + len(self.draft) if self.samples else 0


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
        """Tokens of sequences past their prompt: decodes, and verify chunks' guesses too."""
        return sum(c.num_tokens for c in self.chunks if c.is_decode or c.draft)

    @property
    def num_draft_tokens(self) -> int:
        return sum(len(c.draft) for c in self.chunks)

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
    kv_cache: KVCacheManager = field(init=False, repr=False)  # the blocks: tables, prefixes

    def __post_init__(self) -> None:
        self.kv_cache = KVCacheManager(
            self.allocator, self.config.block_size, self.prefix_key, self.config.window
        )

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
            end = seq.num_computed_tokens + n
            while not self.kv_cache.can_allocate(seq, end) and queue:
                victim = queue.pop()  # lowest effective priority, newest
                self._preempt(victim)
                preempted.append(victim)
            if not self.kv_cache.can_allocate(seq, end):
                self._preempt(seq)
                preempted.append(seq)
                continue
            draft: tuple[int, ...] = ()
            if seq.draft_token_ids and n == 1:  # the rest of the queue's needs come first
                spare = budget - n - sum(s.num_uncomputed_tokens for s in queue)
                held = sum(self.kv_cache.blocks_needed(s, s.num_tokens) for s in queue)
                draft = self._draft(seq, n, spare, held)
            self.kv_cache.allocate(seq, end + len(draft))
            chunks.append(ScheduledChunk.of(seq, seq.num_computed_tokens, n + len(draft), draft))
            budget -= n + len(draft)

        prompt = cached = 0
        if not preempted:
            prompt, cached = self._admit(now, budget, chunks)
        return ScheduledBatch(tuple(chunks), tuple(preempted), prompt, cached)

    def _admit(self, now: float, budget: int, chunks: list[ScheduledChunk]) -> tuple[int, int]:
        """Admit waiting sequences into `chunks`; returns (prompt tokens, cached tokens) of
        those admitted for the first time."""
        prompt_tokens = cached_tokens = 0
        kv = self.kv_cache
        watermark = int(kv.num_blocks * self.config.admission_watermark)
        in_flight = kv.blocks_in_flight()
        for seq in self._order(self.waiting, now):
            # Keep a little room for running sequences to grow; with none running, a request
            # that needs the whole pool must still get in.
            reserve = watermark if self.running else 0
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            hits = kv.cached_prefix(seq)
            if kv.waits_for(seq, hits, in_flight):
                continue  # its next block is being computed: it will be a hit next step
            # Admit only when the whole prompt (or recompute) fits: admitting on the first
            # chunk alone lets a long sequence join, then be preempted again at its next chunk.
            if not kv.can_allocate(seq, seq.num_tokens, prefix=hits, reserve=reserve):
                break  # the most urgent waiting request goes first; nothing jumps it
            if hits:
                seq.num_computed_tokens = kv.take_prefix(seq, hits)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
                prompt_tokens += seq.num_prompt_tokens
                cached_tokens += seq.num_cached_tokens
            n = min(seq.num_uncomputed_tokens, budget)
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            kv.allocate(seq, seq.num_computed_tokens + n)
            chunks.append(ScheduledChunk.of(seq, seq.num_computed_tokens, n))
            budget -= n
            in_flight.update(kv.hashes_in_flight(seq))
        return prompt_tokens, cached_tokens

    def _draft(self, seq: Sequence, n: int, spare: int, reserve: int) -> tuple[int, ...]:
        """The guesses of a decoding `seq` (`Sequence.draft_token_ids`) that fit: within the
        budget's `spare` tokens and the free blocks less `reserve` (what every sequence still
        to schedule this step needs comes first). Nothing is ever preempted for a guess."""
        if not seq.draft_token_ids or n != 1 or seq.num_uncomputed_tokens != 1:
            return ()
        end = seq.num_computed_tokens + 1
        free = max(self.kv_cache.num_free - reserve, 0)
        room = (len(seq.block_table) + free) * self.config.block_size - end
        return tuple(seq.draft_token_ids[: max(min(spare, room), 0)])

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks; it waits and is recomputed from its tokens."""
        self.kv_cache.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.running.remove(seq)
        self.waiting.append(seq)

    def advance(
        self, batch: ScheduledBatch, accepted: Mapping[Sequence, int] | None = None
    ) -> None:
        """Record that the batch's chunks were computed (their K/V are now in the pool).

        `accepted`: for each verify chunk's sequence, how many of its guesses it kept (their
        tokens already appended to its output); the K/V written for the others are dropped:
        its table is trimmed back, freeing whole blocks past them (the next steps overwrite
        the rest), and only blocks full of kept tokens are offered to the prefix cache. A
        sequence that finished this step is left alone (its blocks are already back)."""
        for chunk in batch.chunks:
            seq = chunk.seq
            if seq.is_finished:
                continue
            if chunk.draft:
                kept = (accepted or {}).get(seq, 0)
                if not 0 <= kept <= len(chunk.draft):
                    raise ValueError(f"{seq.request_id}: kept {kept} of {len(chunk.draft)}")
                seq.num_computed_tokens = chunk.end - len(chunk.draft) + kept
                self.kv_cache.trim(seq, seq.num_computed_tokens)
            else:
                seq.num_computed_tokens = chunk.end
            self.kv_cache.computed(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take a sequence out of the scheduler for good and return its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv_cache.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
