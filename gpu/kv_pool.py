"""The paged KV cache: one tensor, allocated once, addressed by block.

Layout `[layers, 2, num_blocks, block_size, kv_heads, head_dim]` (index 0 of the second axis is
K, 1 is V). A token at position p of a sequence lives in block `block_table[p // block_size]`,
offset `p % block_size`; its flat slot is `block * block_size + offset`.
"""

from __future__ import annotations

import torch

from gpu.config import ModelConfig


class KVPool:
    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # cache: [layers, 2, num_blocks, block_size, kv_heads, head_dim]
        # torch.empty: on the host, pages are committed as blocks are first written, so a large
        # pool costs nothing until used. Only slot 0 is ever read before being written (it pads
        # ragged decode batches, under a mask), so only it must hold finite values.
        self.cache = torch.empty(
            config.num_layers,
            2,
            num_blocks,
            block_size,
            config.num_kv_heads,
            config.head_dim,
            dtype=dtype,
            device=device,
        )
        self.cache[:, :, 0, 0].zero_()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat K and V views of one layer: each [num_blocks * block_size, kv_heads, head_dim]."""
        kv = self.cache[index]
        return kv[0].flatten(0, 1), kv[1].flatten(0, 1)

    @property
    def nbytes(self) -> int:
        return self.cache.numel() * self.cache.element_size()
