"""Speculative steps through the real scheduler, over a simulated KV pool.

Each step does what the engine does with speculation on: guesses go on some sequences
(`Sequence.draft_token_ids`; the scheduler must ignore those of a sequence that is not
decoding), `schedule()` gives each decoding one a verify chunk, the step "writes" the K/V of
every position of every chunk, the guesses included, keeps a random number of each verify
chunk's guesses, appends them and one token of the model's own, stops or cancels some
sequences in the middle of that, and then calls `advance(batch, accepted)`. Arrivals share
prefixes (a tiny vocabulary, prompts that start like earlier sequences), so with prefix
caching on blocks are shared and hit, those holding accepted guesses included.

The simulated pool records, for every slot (block * block_size + offset) a step writes, the
tokens 0..p whose K/V it holds: position p's K/V depend on all of them, which is stronger than
recording (p, token p). After every step each running sequence must find its own accepted
tokens at every position it has computed and still holds: a rejected guess left behind, a
table trimmed too far, a write into a shared or cached block, a cache entry holding rejected
guesses, or a window release of a block a query still sees shows up as a mismatch.

Three variants: plain, prefix caching, and release behind a sliding window (they do not mix).
"""

from __future__ import annotations

import copy
import random
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu.block_allocator import BlockAllocator, blocks_for
from gpu.prefix_hash import block_hash, root_key
from gpu.scheduler import RELEASED_BLOCK, ScheduledBatch, Scheduler, SchedulerConfig
from gpu.sequence import SamplingParams, Sequence, SequenceStatus
from tests.unit.gpu.test_scheduler import FakeClock

ROOT = root_key("sha256:test", "none", "float32")
ALPHABET = (1, 2, 3)  # a tiny vocabulary: prefixes repeat, guesses often agree
TOKEN = st.sampled_from(ALPHABET)
SYSTEM = [1, 2, 3, 1, 2, 3, 1, 2]  # a shared system prompt
MAX_K = 6  # guesses per sequence and step, at most
STOP = 0.1  # chance that a sampling chunk's run ends at a stop (cut at random)
CANCEL = 0.03  # chance that a cancel lands while a chunk is being computed


class SpeculativeKVMachine(RuleBasedStateMachine):
    """Arrivals, speculative steps and aborts in any order, over a small pool."""

    mode = "plain"  # "plain", "prefix" (prefix caching) or "window" (release behind it)
    # Also assert that guesses change nobody's preemption (see `TestGuessesPreemptNobody`).
    strict_preemption = False
    guess_chance = 0.6  # each step, for each live sequence

    @initialize(
        num_blocks=st.integers(3, 12),
        block_size=st.integers(1, 4),
        budget=st.integers(2, 16),
        max_num_seqs=st.integers(1, 4),
        window=st.integers(2, 8),
    )
    def make(
        self, num_blocks: int, block_size: int, budget: int, max_num_seqs: int, window: int
    ) -> None:
        self.reserved = 1 if self.mode == "window" else 0
        allocator = BlockAllocator(num_blocks + self.reserved)
        if self.reserved:
            assert allocator.allocate() == RELEASED_BLOCK  # held, as the engine's padding is
        config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            block_size=block_size,
            window=window if self.mode == "window" else None,
        )
        self.clock = FakeClock()
        self.s = Scheduler(
            config, allocator, self.clock, prefix_key=ROOT if self.mode == "prefix" else None
        )
        self.bs = block_size
        self.window = config.window
        self.capacity = num_blocks * block_size
        self.slots: dict[int, tuple[int, ...]] = {}  # flat slot -> tokens whose K/V it holds
        self.live: list[Sequence] = []
        self.count = 0
        self.known: list[list[int]] = [[], SYSTEM]  # prompts start like one of these
        self.block_prefixes: set[tuple[int, ...]] = set()  # every sequence's full-block starts
        self.hashes: dict[tuple[int, ...], bytes] = {}

    # -- rules -------------------------------------------------------------------------------

    @rule(
        data=st.data(),
        tail=st.lists(TOKEN, min_size=1, max_size=5),
        new=st.integers(1, 8),
        priority=st.integers(0, 2),
    )
    def arrive(self, data: st.DataObject, tail: list[int], new: int, priority: int) -> None:
        known = data.draw(st.sampled_from(self.known))
        start = known[: data.draw(st.just(len(known)) | st.integers(0, len(known)))]
        prompt = (start + tail)[: self.capacity - 1]
        self.count += 1
        seq = Sequence(
            f"r{self.count}",
            prompt,
            SamplingParams(max_new_tokens=min(new, self.capacity - len(prompt))),
            arrival_time=self.clock.now,
            priority=priority,
        )
        self.s.add(seq)
        self.live.append(seq)

    @rule(seed=st.integers(0, 2**32 - 1))
    def step(self, seed: int) -> None:
        self.run_step(random.Random(seed), shadow=True)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.live))
        self.s.finish(seq, "cancelled")
        self.live.remove(seq)
        assert seq.block_table == []

    def teardown(self) -> None:
        # Whatever happened, the remaining work drains, still speculating, and every block
        # comes back.
        if not hasattr(self, "s"):
            return
        rng = random.Random(0)
        for _ in range(2000):
            if not self.s.has_work():
                break
            self.run_step(rng, shadow=False)
            self.consistent()
        assert not self.s.has_work(), "work left"
        assert self.s.allocator.num_used == self.reserved

    # -- one step, as the engine runs it -----------------------------------------------------

    def run_step(self, rng: random.Random, shadow: bool) -> None:
        s = self.s
        self.propose(rng)
        twin = self.without_guesses() if shadow else None
        was_running = {q.request_id: q.num_uncomputed_tokens for q in s.running}
        batch = s.schedule()
        self.check_batch(batch, was_running)
        if twin is not None:
            self.check_guesses_cost_nobody(batch, twin, was_running)
        registered = self.registered_blocks()
        for chunk in batch.chunks:  # what each chunk attends to, before anything is written
            self.check_reads(chunk.seq, chunk.start)
        for chunk in batch.chunks:
            self.write(chunk.seq, chunk.start, chunk.end, chunk.draft, registered)

        accepted: dict[Sequence, int] = {}
        for chunk in batch.chunks:
            seq = chunk.seq
            if rng.random() < CANCEL:
                s.finish(seq, "cancelled")
                continue
            if not chunk.samples:
                continue
            kept = rng.randint(0, len(chunk.draft))
            if chunk.draft:
                accepted[seq] = kept
            rejected = chunk.draft[kept] if kept < len(chunk.draft) else None
            own = rng.choice([t for t in ALPHABET if t != rejected])  # the model's token
            run = [*chunk.draft[:kept], own]
            stopped = rng.random() < STOP
            if stopped:
                run = run[: rng.randint(1, len(run))]  # a stop token inside the run
            seq.output_token_ids.extend(run)
            if stopped:
                s.finish(seq, "stop")
            elif len(seq.output_token_ids) >= seq.params.max_new_tokens:
                assert len(seq.output_token_ids) == seq.params.max_new_tokens
                s.finish(seq, "length")
        s.advance(batch, accepted)

        for q in self.live:
            q.draft_token_ids = []  # the step is done: its guesses are spent
        for chunk in batch.chunks:
            tokens = chunk.seq.token_slice(0, chunk.seq.num_tokens)
            self.known = [*self.known[-15:], tokens]
            for end in range(self.bs, len(tokens) + 1, self.bs):
                self.block_prefixes.add(tuple(tokens[:end]))
        self.live = [q for q in self.live if not q.is_finished]
        self.clock.now += 1.0

    def propose(self, rng: random.Random) -> None:
        """Guesses for some sequences, within their room as the speculator cuts them (the
        kept ones and one more token must fit in max_new_tokens). Waiting and prefilling
        sequences get some too: the scheduler must not verify those."""
        for q in self.live:
            room = q.params.max_new_tokens - len(q.output_token_ids) - 1
            if room > 0 and rng.random() < self.guess_chance:
                k = rng.randint(1, min(room, MAX_K))
                q.draft_token_ids = [rng.choice(ALPHABET) for _ in range(k)]

    def without_guesses(self) -> ScheduledBatch:
        """What this step would schedule if nobody had guessed (on a copy of everything)."""
        twin = copy.deepcopy(self.s)
        for q in twin.running + twin.waiting:
            q.draft_token_ids = []
        return twin.schedule()

    def write(
        self,
        seq: Sequence,
        start: int,
        end: int,
        draft: tuple[int, ...],
        registered: dict[int, tuple[int, ...]],
    ) -> None:
        tokens = [*seq.token_slice(0, seq.num_tokens), *draft]  # K/V of the guesses too
        a = self.s.allocator
        for p in range(start, end):
            block = seq.block_table[p // self.bs]
            assert not self.released(block), (seq.request_id, p, "written into a released block")
            assert a.ref_count(block) == 1, (seq.request_id, p, "written into a shared block")
            assert block not in registered, (seq.request_id, p, "written into a cached block")
            self.slots[block * self.bs + p % self.bs] = tuple(tokens[: p + 1])

    # -- checks ------------------------------------------------------------------------------

    def released(self, block: int) -> bool:
        return self.window is not None and block == RELEASED_BLOCK

    def check_batch(self, batch: ScheduledBatch, was_running: dict[str, int]) -> None:
        cfg = self.s.config
        chunks = batch.chunks
        assert batch.num_tokens <= cfg.max_num_batched_tokens, "token budget exceeded"
        assert batch.num_draft_tokens == sum(len(c.draft) for c in chunks)
        assert batch.num_decode_tokens == sum(
            c.num_tokens for c in chunks if c.is_decode or c.draft
        )
        assert batch.num_prefill_tokens == batch.num_tokens - batch.num_decode_tokens
        for c in chunks:
            q = c.seq
            assert c.start == q.num_computed_tokens and c.num_tokens >= 1
            assert c.end - len(c.draft) <= q.num_tokens
            if c.draft:
                # Only a running sequence with one token left to compute verifies guesses.
                assert was_running.get(q.request_id) == 1, (q.request_id, "guessed out of turn")
                assert c.start == q.num_tokens - 1 and c.num_tokens == 1 + len(c.draft)
                assert list(c.draft) == q.draft_token_ids[: len(c.draft)]
                assert c.samples and not c.is_decode and c.num_sampled == 1 + len(c.draft)
            # The table covers the chunk, guesses included, and nothing past it.
            assert len(q.block_table) == blocks_for(c.end, self.bs), q.request_id
        for q in batch.preempted:
            assert q.status is SequenceStatus.WAITING and q.block_table == []
            assert q.num_computed_tokens == 0

    def check_guesses_cost_nobody(
        self, batch: ScheduledBatch, twin: ScheduledBatch, was_running: dict[str, int]
    ) -> None:
        """Guesses take only spare budget: every running sequence that gets a chunk without
        them still gets at least that chunk with them (unless preempted, see the xfail)."""
        mine = {c.seq.request_id: c for c in batch.chunks}
        preempted = {q.request_id for q in batch.preempted}
        for theirs in twin.chunks:
            rid = theirs.seq.request_id
            if rid not in was_running or rid in preempted:
                continue
            chunk = mine.get(rid)
            assert chunk is not None, (rid, "lost its chunk to a guess")
            assert chunk.start == theirs.start
            assert chunk.num_tokens - len(chunk.draft) >= theirs.num_tokens, rid
        if self.strict_preemption:
            assert preempted == {q.request_id for q in twin.preempted}, "preempted for a guess"

    def check_reads(self, seq: Sequence, upto: int) -> None:
        """Positions 0 .. upto - 1 hold `seq`'s own tokens' K/V, but those released behind
        the window, which the query at `upto` (and every later one) no longer sees."""
        tokens = seq.token_slice(0, seq.num_tokens)
        for p in range(upto):
            block = seq.block_table[p // self.bs]
            if self.released(block):
                assert self.window is not None and p < upto - self.window + 1, (seq, p)
                continue
            slot = block * self.bs + p % self.bs
            assert self.slots.get(slot) == tuple(tokens[: p + 1]), (seq.request_id, p)

    def hash_of(self, prefix: tuple[int, ...]) -> bytes:
        """The prefix cache's key of the block ending `prefix` (a multiple of block_size)."""
        if prefix not in self.hashes:
            parent = self.hash_of(prefix[: -self.bs]) if len(prefix) > self.bs else ROOT
            self.hashes[prefix] = block_hash(parent, list(prefix[-self.bs :]))
        return self.hashes[prefix]

    def registered_blocks(self) -> dict[int, tuple[int, ...]]:
        """The blocks the prefix cache would serve for any block start seen so far, and the
        tokens (from position 0) that block's hash stands for."""
        if self.mode != "prefix":
            return {}
        found: dict[int, tuple[int, ...]] = {}
        for prefix in self.block_prefixes:
            block = self.s.allocator.lookup(self.hash_of(prefix))
            if block is not None:
                assert block not in found or found[block] == prefix, "one block, two hashes"
                found[block] = prefix
        return found

    @invariant()
    def consistent(self) -> None:
        s, a, bs = self.s, self.s.allocator, self.bs
        assert a.num_free + a.num_used == a.num_blocks
        assert a.num_empty + a.num_cached == a.num_free
        registered = self.registered_blocks()
        owners = Counter(b for q in s.running for b in q.block_table if not self.released(b))
        assert a.num_used == len(owners) + self.reserved, "a used block no table holds"
        for block, count in owners.items():
            assert a.ref_count(block) == count, block
            # Two tables share a block only through the prefix cache.
            assert count == 1 or block in registered, block
        for q in s.running:
            assert q.status is SequenceStatus.RUNNING
            # Between steps a table holds exactly the computed tokens' blocks: the step's
            # guesses past them are trimmed back (the next step allocates again).
            assert len(q.block_table) == blocks_for(q.num_computed_tokens, bs), q.request_id
            assert 0 < q.num_computed_tokens < q.num_tokens
            if self.window is not None:  # released: exactly what no future query sees
                dead = max(0, q.num_computed_tokens - self.window + 1) // bs
                assert q.block_table[:dead] == [RELEASED_BLOCK] * dead
                assert RELEASED_BLOCK not in q.block_table[dead:]
            self.check_reads(q, q.num_computed_tokens)
        for q in s.waiting:
            assert q.status is SequenceStatus.WAITING
            assert q.block_table == [] and q.num_computed_tokens == 0
        assert sorted(map(id, s.running + s.waiting)) == sorted(map(id, self.live))
        # What the cache serves holds what its hash says: accepted tokens only.
        for block, prefix in registered.items():
            for offset in range(bs):
                p = len(prefix) - bs + offset
                assert self.slots.get(block * bs + offset) == prefix[: p + 1], (block, p)


SETTINGS = settings(max_examples=120, stateful_step_count=40, deadline=None, derandomize=True)


class PlainMachine(SpeculativeKVMachine):
    mode = "plain"


class PrefixCachingMachine(SpeculativeKVMachine):
    mode = "prefix"


class WindowMachine(SpeculativeKVMachine):
    mode = "window"


class StrictPreemptionMachine(SpeculativeKVMachine):
    """Plain, over a pool tight enough that a guess often takes the last free block."""

    strict_preemption = True
    guess_chance = 1.0

    @initialize(
        num_blocks=st.integers(6, 12),
        block_size=st.integers(1, 2),
        budget=st.integers(8, 16),
        max_num_seqs=st.integers(2, 4),
        window=st.just(2),  # unused: plain
    )
    def make(
        self, num_blocks: int, block_size: int, budget: int, max_num_seqs: int, window: int
    ) -> None:
        super().make(num_blocks, block_size, budget, max_num_seqs, window)


PlainMachine.TestCase.settings = SETTINGS
PrefixCachingMachine.TestCase.settings = SETTINGS
WindowMachine.TestCase.settings = SETTINGS
StrictPreemptionMachine.TestCase.settings = settings(SETTINGS, max_examples=300)

TestPlain = PlainMachine.TestCase
TestPrefixCaching = PrefixCachingMachine.TestCase
TestWindow = WindowMachine.TestCase
TestGuessesPreemptNobody = StrictPreemptionMachine.TestCase
