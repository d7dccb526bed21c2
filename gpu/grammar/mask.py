"""One step's token masks: filled on the host for the constrained rows, applied on the device.

The grammar library writes bitmasks (bit t of a row: token t allowed) straight into one int32
host buffer, one row per constrained sequence; it is copied to the device once per step and
expanded there to a [constrained, vocab] bool mask of the banned tokens (a byte → 8 bits
lookup, no per-bit arithmetic), which the sampler applies to those rows in one `masked_fill`.
Nothing here reads a device tensor back, so the masks cost no device→host sync; on CUDA the
host work overlaps the forward pass, which the backend launches first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu.grammar.matcher import GrammarMatcher, fill_bitmasks


@dataclass(frozen=True)
class StepMask:
    """The constrained rows of one step's sampled logits and what each may not take."""

    rows: torch.Tensor  # [constrained] int64: indices into the sampled rows
    banned: torch.Tensor  # [constrained, vocab] bool: True = the token is not allowed


def banned_bits_table(device: torch.device) -> torch.Tensor:  # [256, 8] bool
    """Row v: for each bit k of byte v (least significant first), whether it is clear."""
    values = torch.arange(256, dtype=torch.int32).unsqueeze(1)
    bits = torch.arange(8, dtype=torch.int32).unsqueeze(0)
    return ((values >> bits) & 1).eq(0).to(device)


class TokenMasks:
    def __init__(self, words: int, device: torch.device, threads: int | None = None) -> None:
        """`words`: int32 words per row's bitmask (`GrammarCompiler.mask_words`);
        `threads`: the grammar library's, for filling rows in parallel (None: its default)."""
        import llguidance  # on first use: an engine without constrained requests needs none

        self.words = words
        self.device = device
        self.executor = llguidance.LLExecutor(threads)
        # A pinned host buffer reused step after step (grown as needed): each step's copy to
        # the device has finished when the step's tokens come back, before the next refill.
        self._host = torch.empty(0, words, dtype=torch.int32)
        self._table = banned_bits_table(device)

    def _buffer(self, rows: int) -> torch.Tensor:
        if self._host.shape[0] < rows:
            self._host = torch.empty(
                max(rows, 2 * self._host.shape[0]),
                self.words,
                dtype=torch.int32,
                pin_memory=self.device.type == "cuda",
            )
        return self._host[:rows]

    def build(
        self,
        matchers: Sequence[GrammarMatcher | None],
        vocab: int,
        ahead: Sequence[Sequence[int]] | None = None,
    ) -> StepMask | None:
        """The mask of each sampled row that has a matcher (`matchers[i]`: row i's, None for
        an unconstrained row), or None when no row is constrained. `ahead[i]`: tokens row i
        follows beyond its matcher's accepted output (a verify chunk's earlier guesses): its
        mask is the grammar's after them, computed one row at a time on this thread (several
        rows share one matcher)."""
        rows = [row for row, m in enumerate(matchers) if m is not None]
        if not rows:
            return None
        host = self._buffer(len(rows))  # [constrained, words]
        row_bytes = self.words * 4
        slots: list[tuple[GrammarMatcher, int]] = []
        for j, row in enumerate(rows):
            matcher = matchers[row]
            assert matcher is not None
            if ahead is not None and ahead[row]:
                matcher.mask_after(ahead[row], host.data_ptr() + j * row_bytes, row_bytes)
            else:
                slots.append((matcher, j))
        if slots:
            fill_bitmasks(self.executor, slots, host.data_ptr(), row_bytes, len(rows))
        cuda = self.device.type == "cuda"
        bitmask = host.to(self.device, non_blocking=True) if cuda else host
        index = torch.tensor(rows, dtype=torch.long)
        index = index.pin_memory().to(self.device, non_blocking=True) if cuda else index
        return StepMask(index, expand_banned(bitmask, self._table, vocab))


def expand_banned(
    bitmask: torch.Tensor,  # [rows, words] int32, bit t of a row set: token t allowed
    table: torch.Tensor,  # [256, 8] bool (`banned_bits_table`)
    vocab: int,
) -> torch.Tensor:  # [rows, vocab] bool, True = banned
    """Bit t of a row → column t (int32 words in little-endian byte order, as both the host
    and CUDA devices hold them); columns past the bitmask's (a padded vocabulary) are banned."""
    rows, words = bitmask.shape
    as_bytes = bitmask.contiguous().view(torch.uint8).view(rows, words * 4)
    banned = table[as_bytes.long()].view(rows, words * 32)  # [rows, words * 32]
    if words * 32 >= vocab:
        return banned[:, :vocab]
    pad = torch.ones(rows, vocab - words * 32, dtype=torch.bool, device=bitmask.device)
    return torch.cat([banned, pad], dim=1)
