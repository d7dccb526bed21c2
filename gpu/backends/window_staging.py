"""A step seen through the sliding window, staged with the rest of the step's inputs.

A query at p sees (p - window, p]: decode groups carry where each sequence's window starts
(a kernel skips what precedes it) or only the window's blocks with a windowed mask (SDPA), and
prefill spans read only the blocks holding the window. Blocks older than the window are never
read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from gpu.backends.metadata import AttentionMetadata, DecodeGroup, PrefillSpan
from gpu.block_allocator import blocks_for
from gpu.kv_pool import PAD_BLOCK
from gpu.scheduler import ScheduledChunk
from gpu.step_inputs import Staged, StepInputs


@dataclass(frozen=True)
class WindowStaging:
    """The step seen through the sliding window, staged with the rest of the step's inputs:
    a query at p sees (p - window, p], and only the blocks holding those positions are read."""

    window: int
    block_size: int
    # per decode group: (starts for the kernels, or each member's first block; blocks from
    # those firsts (SDPA only); their width)
    groups: tuple[tuple[Staged, Staged | None, int], ...]
    spans: tuple[tuple[ScheduledChunk, int, Staged | None], ...]  # (chunk, first block, blocks)

    @classmethod
    def stage(
        cls,
        stage: StepInputs,
        window: int,
        bs: int,  # block size
        in_place: bool,  # decode attention by a kernel that takes each window's start
        chunks: list[ScheduledChunk],
        decodes: list[ScheduledChunk],
        runs: list[tuple[int, int]],
    ) -> WindowStaging:
        groups: list[tuple[Staged, Staged | None, int]] = []
        for begin, end in runs:
            members = decodes[begin:end]
            starts = [max(0, c.end - window) for c in members]
            if in_place:  # the kernel skips what precedes each start
                groups.append((stage.put(starts), None, 0))
                continue
            firsts = [start // bs for start in starts]
            width = max(blocks_for(c.end, bs) - f for c, f in zip(members, firsts, strict=True))
            tables = [  # each its own blocks only (`StepBatch.build`)
                c.seq.block_table[f : blocks_for(c.end, bs)]
                for c, f in zip(members, firsts, strict=True)
            ]
            groups.append((stage.put(firsts), stage.put_rows(tables, width, PAD_BLOCK), width))
        spans = []
        for chunk in chunks[len(decodes) :]:
            first = max(0, chunk.start - window + 1) // bs  # the block of the first key seen
            blocks = None
            if chunk.start:
                blocks = stage.put(chunk.seq.block_table[first : blocks_for(chunk.end, bs)])
            spans.append((chunk, first, blocks))
        return cls(window, bs, tuple(groups), tuple(spans))

    def build(
        self,
        stage: StepInputs,
        groups: list[DecodeGroup],
        slots: torch.Tensor,
    ) -> AttentionMetadata:
        window, bs, device = self.window, self.block_size, slots.device
        local_groups: list[DecodeGroup] = []
        for group, (staged, staged_blocks, width) in zip(groups, self.groups, strict=True):
            if staged_blocks is None:
                local_groups.append(replace(group, starts=stage.view(staged)))
                continue
            # key j of member m is at position firsts[m] * bs + j
            base = stage.view(staged).unsqueeze(1) * bs
            keys = base + torch.arange(width * bs, device=device).unsqueeze(0)
            lengths = group.lengths.unsqueeze(1)
            valid = (keys < lengths) & (keys >= lengths - window)  # [members, width * bs]
            mask = valid.view(group.end - group.begin, 1, 1, -1)
            blocks = stage.view(staged_blocks)
            local_groups.append(DecodeGroup(group.begin, group.end, blocks, group.lengths, mask))

        spans: list[PrefillSpan] = []
        row = sum(g.end - g.begin for g in groups)
        for chunk, first, staged_table in self.spans:
            n = chunk.num_tokens
            query_pos = torch.arange(chunk.start, chunk.end, device=device).unsqueeze(1)
            if staged_table is None:
                key_pos = query_pos.view(1, -1)
                mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
                spans.append(PrefillSpan(row, row + n, n, None, mask if n > window else None))
            else:
                key_pos = torch.arange(first * bs, chunk.end, device=device).unsqueeze(0)
                mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
                blocks = stage.view(staged_table)
                spans.append(PrefillSpan(row, row + n, chunk.end - first * bs, blocks, mask))
            row += n
        return AttentionMetadata(
            slot_mapping=slots,
            decodes=tuple(local_groups),
            prefills=tuple(spans),
            window=window,
        )
