"""Turns a `ScheduledBatch` into tensors, runs the model once, and samples.

All per-step index tensors are built here, once, on the host from small Python lists (block
tables, lengths), copied to the device in one go, and expanded to per-token slots there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import torch

from gpu.block_allocator import blocks_for
from gpu.grammar.mask import TokenMasks
from gpu.grammar.matcher import JsonMatcher
from gpu.kernels.native import CpuKernels
from gpu.kv_pool import PAD_BLOCK, KVPool
from gpu.models.attention import AttentionMetadata, DecodeGroup, PrefillSpan
from gpu.sampling import sample
from gpu.scheduler import ScheduledBatch, ScheduledChunk
from gpu.step_clock import StepClock

# A decode group's longest context is at most GROUP_SLACK × its shortest + GROUP_SLACK_TOKENS.
GROUP_SLACK = 1.25
GROUP_SLACK_TOKENS = 16


def group_by_length(lengths: list[int]) -> list[tuple[int, int]]:
    """Split ascending `lengths` into [begin, end) runs whose padding stays within the slack."""
    runs: list[tuple[int, int]] = []
    begin = 0
    for i, length in enumerate(lengths):
        if length > lengths[begin] * GROUP_SLACK + GROUP_SLACK_TOKENS:
            runs.append((begin, i))
            begin = i
    if lengths:
        runs.append((begin, len(lengths)))
    return runs


class CausalLM(Protocol):
    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv: KVPool,
        meta: AttentionMetadata,
        logits_rows: torch.Tensor,
    ) -> torch.Tensor: ...


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv: KVPool,
        device: torch.device,
        seed: int = 0,
        kernels: CpuKernels | None = None,
        window: int | None = None,
        long_rope: tuple[int, int] | None = None,
    ) -> None:
        """`kernels`: tokenmill's native CPU kernels, for decode attention straight from the
        pool (all decodes in one group); None: SDPA over gathered blocks, grouped by length.
        `window`: the model's sliding window, if some layers have one: each step's metadata
        then carries its view through the window too (`AttentionMetadata.local`).
        `long_rope`: LongRoPE's (original, max_positions) (`gpu.models.layers.long_rope_rows`):
        each step's metadata then carries the rope table row of every token."""
        self.model = model
        self.long_rope = long_rope
        self.window = window
        self.kv = kv
        self.device = device
        self.kernels = kernels
        self.block_size = kv.block_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def _to_device(self, values: list[int]) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=torch.long)
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def _block_rows(
        self, block_tables: list[list[int]], width: int, firsts: list[int] | None = None
    ) -> torch.Tensor:
        """`width` blocks of each table from its first (`firsts`, else 0), padded with
        PAD_BLOCK: [tables * width]."""
        rows: list[int] = []
        for i, table in enumerate(block_tables):
            first = firsts[i] if firsts is not None else 0
            head = table[first : first + width]
            rows += head + [PAD_BLOCK] * (width - len(head))
        return self._to_device(rows)

    def prepare(
        self, chunks: list[ScheduledChunk], timing: StepClock | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Inputs for chunks (decodes first): ids, positions, metadata, rows to sample."""
        ids: list[int] = []
        positions: list[int] = []
        rope_rows: list[int] = []
        slot_mapping: list[int] = []
        sample_rows: list[int] = []
        bs = self.block_size
        partial: list[int] = []  # blocks first written this step whose tail stays unwritten
        for chunk in chunks:
            seq = chunk.seq
            last = (chunk.end - 1) // bs
            if chunk.end % bs and last * bs >= chunk.start:
                partial.append(seq.block_table[last])
            for pos in range(chunk.start, chunk.end):
                slot_mapping.append(seq.block_table[pos // bs] * bs + pos % bs)
            ids.extend(seq.token_slice(chunk.start, chunk.end))
            positions.extend(range(chunk.start, chunk.end))
            if self.long_rope is not None:
                original, offset = self.long_rope
                # A sequence longer than `original` is rotated by the long factors throughout.
                shift = offset if seq.num_tokens > original else 0
                rope_rows.extend(
                    p + shift if p < original else p for p in range(chunk.start, chunk.end)
                )
            if chunk.samples:
                sample_rows.append(len(ids) - 1)

        self.kv.zero(partial)

        decodes = [c for c in chunks if c.is_decode]
        groups: list[DecodeGroup] = []
        lengths_of = [c.end for c in decodes]
        # The native kernel stops at each sequence's length: one group pads nothing it reads.
        runs = group_by_length(lengths_of) if self.kernels is None else [(0, len(decodes))]
        for begin, end in runs if decodes else []:
            members = decodes[begin:end]
            width = blocks_for(members[-1].end, bs)
            blocks = self._block_rows([c.seq.block_table for c in members], width)
            lengths = self._to_device(lengths_of[begin:end])
            mask = None
            if self.kernels is None:
                keys = torch.arange(width * bs, device=self.device)
                valid = keys.unsqueeze(0) < lengths.unsqueeze(1)  # [members, width * block_size]
                mask = valid.view(end - begin, 1, 1, -1)
            groups.append(DecodeGroup(begin, end, blocks, lengths, mask))

        spans: list[PrefillSpan] = []
        row = len(decodes)
        for chunk in chunks[len(decodes) :]:
            n = chunk.num_tokens
            if chunk.start == 0:
                spans.append(PrefillSpan(row, row + n, n, None, None))
            else:
                blocks = self._block_rows([chunk.seq.block_table], blocks_for(chunk.end, bs))
                query_pos = torch.arange(chunk.start, chunk.end, device=self.device).unsqueeze(1)
                key_pos = torch.arange(chunk.end, device=self.device).unsqueeze(0)
                spans.append(PrefillSpan(row, row + n, chunk.end, blocks, key_pos <= query_pos))
            row += n

        slots = self._to_device(slot_mapping)
        local = None
        if self.window is not None:
            local = self._local_view(chunks, decodes, groups, runs, slots, timing)
        meta = AttentionMetadata(
            slot_mapping=slots,
            decodes=tuple(groups),
            prefills=tuple(spans),
            timing=timing,
            kernels=self.kernels,
            local=local,
            rope_rows=self._to_device(rope_rows) if self.long_rope is not None else None,
        )
        return self._to_device(ids), self._to_device(positions), meta, sample_rows

    def _local_view(
        self,
        chunks: list[ScheduledChunk],
        decodes: list[ScheduledChunk],
        groups: list[DecodeGroup],
        runs: list[tuple[int, int]],
        slots: torch.Tensor,
        timing: StepClock | None,
    ) -> AttentionMetadata:
        """The step seen through the sliding window: a query at p sees (p - window, p], and
        only the blocks holding those positions are read."""
        assert self.window is not None
        window, bs = self.window, self.block_size
        local_groups: list[DecodeGroup] = []
        for group, (begin, end) in zip(groups, runs if decodes else [], strict=True):
            members = decodes[begin:end]
            starts = [max(0, c.end - window) for c in members]
            if self.kernels is not None:  # the kernel skips what precedes each start
                starts_t = self._to_device(starts)
                local_groups.append(replace(group, starts=starts_t))
                continue
            firsts = [start // bs for start in starts]
            width = max(blocks_for(c.end, bs) - f for c, f in zip(members, firsts, strict=True))
            tables = [c.seq.block_table for c in members]
            blocks = self._block_rows(tables, width, firsts)
            # key j of member m is at position firsts[m] * bs + j
            base = torch.tensor(firsts, device=self.device).unsqueeze(1) * bs
            keys = base + torch.arange(width * bs, device=self.device).unsqueeze(0)
            lengths = group.lengths.unsqueeze(1)
            valid = (keys < lengths) & (keys >= lengths - window)  # [members, width * bs]
            mask = valid.view(end - begin, 1, 1, -1)
            local_groups.append(DecodeGroup(begin, end, blocks, group.lengths, mask))

        spans: list[PrefillSpan] = []
        row = len(decodes)
        for chunk in chunks[len(decodes) :]:
            n = chunk.num_tokens
            first = max(0, chunk.start - window + 1) // bs  # the block of the first key seen
            query_pos = torch.arange(chunk.start, chunk.end, device=self.device).unsqueeze(1)
            if chunk.start == 0:
                key_pos = query_pos.view(1, -1)
                mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
                spans.append(PrefillSpan(row, row + n, n, None, mask if n > window else None))
            else:
                table = [chunk.seq.block_table]
                blocks = self._block_rows(table, blocks_for(chunk.end, bs) - first, [first])
                key_pos = torch.arange(first * bs, chunk.end, device=self.device).unsqueeze(0)
                mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
                spans.append(PrefillSpan(row, row + n, chunk.end - first * bs, blocks, mask))
            row += n
        return AttentionMetadata(
            slot_mapping=slots,
            decodes=tuple(local_groups),
            prefills=tuple(spans),
            timing=timing,
            kernels=self.kernels,
            window=window,
        )

    @torch.inference_mode()
    def run(
        self,
        batch: ScheduledBatch,
        timing: StepClock | None = None,
        matchers: Mapping[str, JsonMatcher] | None = None,
        masks: TokenMasks | None = None,
    ) -> list[tuple[ScheduledChunk, int]]:
        """Compute the batch; return the sampled next token of each chunk that samples.
        `timing`: where to add the time of prepare, forward (and attention) and sample.
        `matchers`: the grammar of each constrained request, by id, whose masks `masks`
        builds (after the forward is launched, so on CUDA the two overlap)."""
        lap = timing.now() if timing is not None else 0.0
        # Decodes first, shortest context first (so length groups are contiguous), then prefills.
        chunks = sorted(batch.chunks, key=lambda c: (not c.is_decode, c.end if c.is_decode else 0))
        ids, positions, meta, sample_rows = self.prepare(chunks, timing)
        sampling = [c for c in chunks if c.samples]
        if not sampling:
            # Only mid-prompt chunks: the K/V writes are the whole point; no logits needed.
            sample_rows = [0]
        rows = self._to_device(sample_rows)
        if timing is not None:
            lap = timing.lap("prepare", lap)
        logits = self.model(ids, positions, self.kv, meta, rows)
        if timing is not None:
            lap = timing.lap("forward", lap)
        if not sampling:
            return []
        mask = None
        if matchers and masks is not None:
            rows_matchers = [matchers.get(c.seq.request_id) for c in sampling]
            mask = masks.build(rows_matchers, logits.shape[-1])
        tokens = sample(
            logits,
            [c.seq.params for c in sampling],
            [c.end for c in sampling],
            self.generator,
            mask,
        )
        if timing is not None:
            timing.lap("sample", lap)
        return list(zip(sampling, tokens, strict=True))
