"""`Fingerprints`: a set of strings in 8 bytes each, so a million-line batch stays small.

A batch run must remember every `custom_id` it has seen (to refuse duplicates) and every one
already answered (to resume). Python's `set[str]` costs ~100 bytes per entry; this keeps a
64-bit BLAKE2b fingerprint per entry in a sorted numpy array (plus a small set of recent
additions, merged in when it grows). Two different strings share a fingerprint with
probability ~n²/2⁶⁵: for a million lines, about 3 in 10⁸.
"""

from __future__ import annotations

import hashlib

import numpy as np

_MERGE_AT = 1 << 16  # recent additions kept in a set before merging into the sorted array


def fingerprint(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


class Fingerprints:
    def __init__(self) -> None:
        self._sorted = np.empty(0, dtype=np.uint64)
        self._recent: set[int] = set()

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def __contains__(self, key: str) -> bool:
        value = fingerprint(key)
        if value in self._recent:
            return True
        at = int(np.searchsorted(self._sorted, np.uint64(value)))
        return at < len(self._sorted) and int(self._sorted[at]) == value

    def add(self, key: str) -> bool:
        """Add `key`; return False when it was already there."""
        if key in self:
            return False
        self._recent.add(fingerprint(key))
        if len(self._recent) >= _MERGE_AT:
            self._merge()
        return True

    def _merge(self) -> None:
        # `add` never puts a value in both, so a sort suffices; np.union1d's temporaries
        # (unique's masks and copies) left ~60 bytes of RSS per entry behind at a million.
        recent = np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent))
        merged = np.concatenate((self._sorted, recent))
        merged.sort()
        self._sorted = merged
        self._recent.clear()
