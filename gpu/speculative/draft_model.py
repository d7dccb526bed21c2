"""A draft model's proposals: a smaller (or quantized) model with the target's tokenizer guesses
each sequence's next tokens greedily, on the engine's own machinery and a KV pool of its own.

Per sequence the proposer keeps what the draft has computed: a private `Sequence` whose block
table lives in the draft's pool. Each `propose`:

1. syncs: the longest common prefix of what the draft computed and the request's tokens stays;
   the rest (guesses the target rejected) is trimmed off (`KVCacheManager.trim`);
2. catches up: every sequence's tokens after that prefix, in forwards of at most the engine's
   token budget (one, usually: the target's last token and the guesses it accepted);
3. decodes: up to `max_tokens` greedy steps, every sequence in one forward per step.

The last guess's K/V are never computed (nothing reads them unless it is accepted, and the next
sync computes it then). Greedy (argmax) guesses are point-mass proposals: verification keeps the
output distribution exactly the target's. A sequence that does not fit the pool gets no guesses
and gives back what it held: the draft never fails the target's request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu.backends.choose import build_backend
from gpu.block_allocator import BlockAllocator, blocks_for
from gpu.device import dtype_name
from gpu.engine_config import EngineConfig, size_kv_pool
from gpu.errors import OutOfKVBlocks, SpeculativeConfigError
from gpu.kv_cache_manager import KVCacheManager
from gpu.kv_pool import PAD_BLOCK, KVPool
from gpu.loading.loader import LoadedModel, load_model
from gpu.memory.model_sizes import kv_bytes_per_token
from gpu.models.layers import long_rope_rows
from gpu.scheduler import ScheduledBatch, ScheduledChunk
from gpu.sequence import SamplingParams
from gpu.sequence import Sequence as Seq
from gpu.speculative.config import MAX_K
from gpu.speculative.proposer import ProposalRequest

SELF_DRAFT_QUANTIZATION = "int4"  # the target's own checkpoint, drafting for itself
POOL_SHARE = 4  # the draft's pool holds at most 1/POOL_SHARE of the target's KV bytes
# A draft sequence samples (`ScheduledChunk.samples` needs max_new_tokens > 0); the argmax is
# taken here, so nothing else of these parameters is used.
_GREEDY = SamplingParams(max_new_tokens=MAX_K)


def check_draft(draft: LoadedModel, target: LoadedModel) -> None:
    """Raise `SpeculativeConfigError` unless `draft` can propose for `target`: the same
    tokenizer (vocabulary digest), and no token id the target does not have."""
    mine, theirs = draft.tokenizer.vocab_digest, target.tokenizer.vocab_digest
    if mine != theirs:
        raise SpeculativeConfigError(
            f"draft model {draft.name!r} does not share the tokenizer of {target.name!r} "
            f"(vocabulary digests {mine[:19]}… and {theirs[:19]}… differ)"
        )
    if draft.config.vocab_size > target.config.vocab_size:
        raise SpeculativeConfigError(
            f"draft model {draft.name!r} has {draft.config.vocab_size} token ids, more than "
            f"{target.name!r}'s {target.config.vocab_size}"
        )


def load_draft(
    path: Path, target: LoadedModel, quantization: str = "none", *, name: str | None = None
) -> LoadedModel:
    """The draft model at `path` for `target`, in its dtype and on its device, checked
    (`check_draft`). The target's own checkpoint loads int4 (an int4 draft for a float32
    target); any other with `quantization` (the engine's). Raises `CheckpointError` or
    `SpeculativeConfigError`."""
    if Path(path).resolve() == Path(target.path).resolve():
        quantization = SELF_DRAFT_QUANTIZATION
    draft = load_model(
        path, name=name, dtype=target.dtype, device=target.device, quantization=quantization
    )
    check_draft(draft, target)
    return draft


def draft_pool_blocks(
    draft: LoadedModel,
    target: LoadedModel,
    config: EngineConfig,
    max_model_len: int,
    target_blocks: int | None = None,
) -> int:
    """Blocks for the draft's pool: `max_num_seqs` sequences of `max_model_len` (and their
    guesses), or 1/POOL_SHARE of the bytes of the target's pool (`target_blocks`, or as
    `size_kv_pool` sizes it), whichever is smaller; at least one block."""
    bs = config.block_size
    wanted = config.max_num_seqs * blocks_for(max_model_len + MAX_K, bs)
    if target_blocks is None:
        try:
            target_blocks = size_kv_pool(target, config, max_model_len)
        except OutOfKVBlocks:  # memory moved since the target's pool was sized
            target_blocks = blocks_for(max_model_len, bs)
    target_bytes = target_blocks * bs * kv_bytes_per_token(target.config, dtype_name(target.dtype))
    per_token = kv_bytes_per_token(draft.config, dtype_name(draft.dtype))
    return max(1, min(wanted, target_bytes // POOL_SHARE // per_token // bs))


@dataclass(eq=False)
class _Draft:
    """One sequence as the draft knows it."""

    seq: Seq  # its tokens (the request's, then this step's guesses) and block table
    known: int = 0  # how many leading tokens came from the request (not guessed)
    long: bool = False  # LongRoPE: its K/V were rotated by the long factors


class DraftModelProposer:
    """Greedy guesses from a draft model (see the module). `num_blocks`: the draft pool's size
    (default: `draft_pool_blocks`); `target_blocks`: the target's pool, to size it by."""

    name = "draft"

    def __init__(
        self,
        draft: LoadedModel,
        target: LoadedModel,
        config: EngineConfig,
        max_model_len: int,
        *,
        num_blocks: int | None = None,
        target_blocks: int | None = None,
    ) -> None:
        check_draft(draft, target)
        self.model = draft
        bs = self.block_size = config.block_size
        # Positions the draft may compute: the target's sequences and their guesses, within
        # what the draft's own positions reach.
        self.max_len = min(max_model_len + MAX_K, draft.config.max_position_embeddings)
        max_blocks = blocks_for(self.max_len, bs)
        if num_blocks is None:
            num_blocks = draft_pool_blocks(draft, target, config, max_model_len, target_blocks)
        self.num_blocks = num_blocks
        self.budget = config.max_num_batched_tokens  # tokens per catch-up forward
        self.kv = KVPool(
            draft.config,
            num_blocks + 1,  # and the padding block
            bs,
            # As the engine's: every sequence's blocks gathered at full length, padding too.
            workspace_blocks=config.max_num_seqs * max_blocks,
            dtype=draft.dtype,
            device=draft.device,
        )
        allocator = BlockAllocator(num_blocks + 1)
        if allocator.allocate() != PAD_BLOCK:  # held for good, as the engine holds it
            raise RuntimeError("a fresh allocator did not hand out the padding block first")
        # No prefix caching, no release behind a window: every block stays trimmable.
        self.blocks = KVCacheManager(allocator, bs)
        windows = {draft.config.layer_window(i) for i in range(draft.config.num_layers)}
        self.long_rope = long_rope_rows(draft.config)
        self.backend = build_backend(
            draft,
            self.kv,
            config,
            window=max((w for w in windows if w is not None), default=None),
            long_rope=self.long_rope,
            max_blocks=max_blocks,
        )
        self.backend.capture()  # on the thread that builds the engine, which steps it
        self._drafts: dict[str, _Draft] = {}

    @property
    def blocks_used(self) -> int:
        """Blocks the draft's sequences hold (the padding block is not counted)."""
        return self.blocks.allocator.num_used - 1

    def release(self, seq_id: str) -> None:
        draft = self._drafts.pop(seq_id, None)
        if draft is not None:
            self.blocks.free(draft.seq)

    @torch.inference_mode()
    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        guesses: list[list[int]] = [[] for _ in requests]
        live: list[tuple[list[int], Seq, int]] = []  # (its guesses, its sequence, how many)
        for out, request in zip(guesses, requests, strict=True):
            synced = self._sync(request)
            if synced is not None:
                live.append((out, *synced))
        if not live:
            return guesses
        first = self._catch_up([seq for _, seq, _ in live])
        for out, seq, _ in live:
            out.append(first[seq])
        going = [(out, seq) for out, seq, want in live if want > 1]
        while going:
            for out, seq in going:
                seq.output_token_ids.append(out[-1])
            chunks = [ScheduledChunk.of(seq, seq.num_computed_tokens, 1) for _, seq in going]
            tokens = self._forward(chunks)
            for (out, seq), chunk in zip(going, chunks, strict=True):
                seq.num_computed_tokens = chunk.end
                out.append(tokens[chunk])
            going = [(out, seq) for out, seq, want in live if len(out) < want]
        return guesses

    def _sync(self, request: ProposalRequest) -> tuple[Seq, int] | None:
        """The request's draft sequence, its computed prefix kept where it still agrees and
        its table grown for this step's guesses, and how many to guess; None: no room (it then
        holds nothing)."""
        tokens = list(request.token_ids)
        if not tokens:
            return None
        # Guess g_j is computed to give g_{j+1}: positions up to len(tokens) + want - 2.
        want = min(request.max_tokens, self.max_len - len(tokens) + 1)
        draft = self._drafts.get(request.seq_id)
        if draft is None:
            if want < 1:
                return None
            draft = self._drafts[request.seq_id] = _Draft(Seq(request.seq_id, [], _GREEDY, 0.0))
        seq = draft.seq
        computed = seq.token_slice(0, seq.num_computed_tokens)
        keep = min(_common_prefix(computed, tokens, draft.known), len(tokens) - 1)
        # LongRoPE: a sequence grown past the original length is rotated by the long factors
        # throughout, as the target recomputes it (`Engine.step`): so is the draft's.
        long = self.long_rope is not None and len(tokens) > self.long_rope[0]
        if long != draft.long:
            keep, draft.long = 0, long
        self.blocks.trim(seq, keep)
        seq.num_computed_tokens = keep
        seq.prompt_token_ids, seq.output_token_ids = tokens, []
        draft.known = len(tokens)
        room = (len(seq.block_table) + self.blocks.num_free) * self.block_size
        want = min(want, room - len(tokens) + 1)
        if want < 1:
            self.release(request.seq_id)
            return None
        self.blocks.allocate(seq, len(tokens) + want - 1)
        return seq, want

    def _catch_up(self, seqs: list[Seq]) -> dict[Seq, int]:
        """Compute each sequence's tokens past its computed prefix, within the token budget
        per forward; the first guess of each."""
        first: dict[Seq, int] = {}
        pending = seqs
        while pending:
            chunks: list[ScheduledChunk] = []
            budget = self.budget
            for seq in pending:
                if budget == 0:
                    break
                n = min(seq.num_uncomputed_tokens, budget)
                chunks.append(ScheduledChunk.of(seq, seq.num_computed_tokens, n))
                budget -= n
            tokens = self._forward(chunks)
            for chunk in chunks:
                chunk.seq.num_computed_tokens = chunk.end
                if chunk in tokens:
                    first[chunk.seq] = tokens[chunk]
            pending = [seq for seq in pending if seq.num_uncomputed_tokens]
        return first

    def _forward(self, chunks: list[ScheduledChunk]) -> dict[ScheduledChunk, int]:
        """One forward over `chunks`: the argmax next token of each chunk that samples."""
        step = self.backend.prepare(ScheduledBatch(tuple(chunks)))
        logits = self.backend.compute(step)  # [sampled rows (+ none scored), vocab]
        rows = len(step.sampling)
        tokens = logits[:rows].argmax(dim=-1).tolist()  # the forward's one read from the device
        return dict(zip(step.sampling, tokens, strict=True))


def _common_prefix(a: list[int], b: list[int], known: int) -> int:
    """The length of the common prefix of `a` and `b`, where the first `known` tokens usually
    agree (checked at C speed first; only the guesses after them are compared one by one)."""
    n = min(len(a), len(b))
    i = known if known <= n and a[:known] == b[:known] else 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
