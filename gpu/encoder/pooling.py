"""Pooling a packed batch's token states into one vector per sequence, as sentence-transformers'
`Pooling` does over a padded one (its modes, concatenated in order). No padding here: every
row of a sequence's span is one of its tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pool(
    states: torch.Tensor,  # [tokens, hidden] sequences one after another
    lengths: Sequence[int],  # each sequence's tokens, in order (all > 0)
    modes: Sequence[str],  # of `gpu.encoder.pipeline.POOLING_MODES`
) -> torch.Tensor:  # [sequences, hidden × len(modes)]
    device = states.device
    n = torch.tensor(lengths, device=device)  # [sequences]
    ends = n.cumsum(0)  # [sequences] one past each sequence's last row
    starts = ends - n
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), n)  # [tokens]
    sums: torch.Tensor | None = None
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(states[starts])
        elif mode == "lasttoken":
            out.append(states[ends - 1])
        elif mode == "max":
            init = states.new_full((len(lengths), states.shape[1]), float("-inf"))
            index = seq.unsqueeze(1).expand_as(states)
            out.append(init.scatter_reduce(0, index, states, reduce="amax"))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            if sums is None:
                sums = states.new_zeros(len(lengths), states.shape[1]).index_add_(0, seq, states)
            count = n.to(states.dtype).unsqueeze(1)  # [sequences, 1]
            out.append(sums / (count if mode == "mean" else count.sqrt()))
        elif mode == "weightedmean":  # token i of a sequence weighs i + 1
            weights = (torch.arange(states.shape[0], device=device) - starts[seq] + 1).to(
                states.dtype
            )  # [tokens]
            total = states.new_zeros(len(lengths), states.shape[1])
            total.index_add_(0, seq, states * weights.unsqueeze(1))
            out.append(total / (n * (n + 1) / 2).to(states.dtype).unsqueeze(1))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return torch.cat(out, dim=-1)
