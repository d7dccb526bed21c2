"""The paged KV cache: one tensor, allocated once, addressed by block.

Layout `[layers, 2, num_blocks, block_size, kv_heads, head_dim]` (index 0 of the second axis is
K, 1 is V). A token at position p of a sequence lives in block `block_table[p // block_size]`,
offset `p % block_size`; its flat slot is `block * block_size + offset`.

Attention reads a sequence's blocks by copying them, in block-table order, into a gather
workspace that is also allocated once here, so no step allocates memory in proportion to the
context it attends to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu.model_config import ModelConfig

PAD_BLOCK = 0  # always zero; pads block tables, never holds a sequence's K/V


@dataclass(frozen=True)
class LayerKV:
    """One layer's view of the pool and of the gather workspace."""

    k: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v: torch.Tensor
    k_work: torch.Tensor  # [workspace_blocks, block_size, kv_heads, head_dim]
    v_work: torch.Tensor


class KVPool:
    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        workspace_blocks: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        # cache: [layers, 2, num_blocks, block_size, kv_heads, head_dim]
        # Allocated, not zeroed: on a host, pages are committed as blocks are first used, so a
        # large pool costs memory only as work fills it. Decodes read whole blocks, masking the
        # unwritten tail; masked values must still be finite (0 × NaN is NaN), and nothing one
        # request left in a block may reach another. So the backend zeroes each block that a
        # step starts and leaves partly written (`zero`), and block 0, the padding of ragged
        # block tables, is zeroed here and never handed out (`PAD_BLOCK`).
        self.cache = torch.empty(config.num_layers, 2, *shape, dtype=dtype, device=device)
        self.zero(torch.tensor([PAD_BLOCK], device=device))
        # work: [2, workspace_blocks, block_size, kv_heads, head_dim], shared by all layers
        self.work = torch.empty(2, workspace_blocks, *shape[1:], dtype=dtype, device=device)

    def zero(self, blocks: torch.Tensor) -> None:
        """Zero these blocks ([n] int64, on the pool's device) in every layer, K and V."""
        self.cache.index_fill_(2, blocks, 0)

    def layer(self, index: int) -> LayerKV:
        kv = self.cache[index]
        return LayerKV(kv[0], kv[1], self.work[0], self.work[1])
