"""Content hashes of full KV blocks, chained from the model: the prefix cache's keys. Pure Python.

Block i of a sequence is identified by hash(hash of block i - 1, its `block_size` token ids);
block 0's parent is the cache's root key, which names the model (weights digest, how they are
held, compute dtype). Two blocks have the same hash only when the whole prefix up to their end
is the same tokens under the same model, so their K/V are the same and one can stand for the
other. BLAKE2b with 16-byte digests: collisions are out of reach at any cache size.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable

HASH_BYTES = 16


def root_key(*parts: str) -> bytes:
    """The chain's root for a model named by `parts` (e.g. digest, quantization, dtype)."""
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=HASH_BYTES).digest()


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """The hash of a full block holding `token_ids`, after the block whose hash is `parent`."""
    h = hashlib.blake2b(parent, digest_size=HASH_BYTES)
    h.update(array("I", token_ids).tobytes())
    return h.digest()


def extend_hashes(
    hashes: list[bytes],
    root: bytes,
    num_blocks: int,
    block_size: int,
    tokens: Callable[[int, int], list[int]],
) -> list[bytes]:
    """Grow `hashes` (block 0 on) in place to `num_blocks` entries; `tokens(start, end)` gives
    the token ids at positions [start, end). Returns `hashes`."""
    for i in range(len(hashes), num_blocks):
        parent = hashes[i - 1] if i else root
        hashes.append(block_hash(parent, tokens(i * block_size, (i + 1) * block_size)))
    return hashes
