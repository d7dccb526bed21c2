"""One step's token masks: filled on the host for the constrained rows, applied on the device.

The grammar library writes bitmasks (bit t of a row: token t allowed) straight into one int32
host buffer; it is copied to the device once per step and expanded there to a [rows, vocab]
bool mask, which the sampler applies with one `masked_fill`. Nothing here reads a device
tensor back, so the masks cost no device→host sync; on CUDA the host work overlaps the
forward pass, which the runner launches first.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch

from gpu.grammar.matcher import JsonMatcher, fill_bitmasks


class TokenMasks:
    def __init__(self, words: int, device: torch.device, threads: int | None = None) -> None:
        """`words`: int32 words per row's bitmask (`GrammarCompiler.mask_words`)."""
        self.words = words
        self.device = device
        self.executor = llguidance.LLExecutor(threads)
        # A pinned host buffer reused step after step (grown as needed): each step's copy to
        # the device has finished when the step's tokens come back, before the next refill.
        self._host = torch.empty(0, words, dtype=torch.int32)
        self._bits = torch.arange(32, dtype=torch.int32, device=device)

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
        self, matchers: Sequence[JsonMatcher | None], vocab: int
    ) -> torch.Tensor | None:  # [rows, vocab] bool on the device, True = allowed; None: no mask
        """The allowed tokens of each sampled row (`matchers[i]`: row i's, None when the row
        is unconstrained and may take any token), or None when no row is constrained."""
        constrained = [(m, row) for row, m in enumerate(matchers) if m is not None]
        if not constrained:
            return None
        host = self._buffer(len(matchers))  # [rows, words]
        host.fill_(-1)  # every bit set: unconstrained rows allow every token
        fill_bitmasks(self.executor, constrained, host.data_ptr(), self.words * 4, len(matchers))
        bitmask = host.to(self.device, non_blocking=True)
        return expand(bitmask, self._bits, vocab)


def expand(
    bitmask: torch.Tensor,  # [rows, words] int32
    bits: torch.Tensor,  # [32] int32: 0..31
    vocab: int,
) -> torch.Tensor:  # [rows, vocab] bool
    """Bit t of a row → column t; columns past the bitmask's (a padded vocabulary) are off."""
    rows, words = bitmask.shape
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).view(rows, words * 32).bool()
    if words * 32 >= vocab:
        return allowed[:, :vocab]
    pad = torch.zeros(rows, vocab - words * 32, dtype=torch.bool, device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)
