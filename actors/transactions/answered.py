"""The offsets a partition's results were committed for above its commit point, kept in the
commit's metadata so that the next owner neither loses nor repeats one of them.

Results finish out of order: when the transaction for offset 7 commits while offset 6 still
runs, the consumed offset committed with it can only be 6. Alone that would make the next
owner read 7 again and answer it a second time. So every transaction also writes which
offsets at or past the commit point are answered already, as ranges relative to it:

    tokenmill/1 held 520 0 0 answered 2-5,9,12-40

(base 500: offsets 502..505, 509 and 512..540 are answered). The crash guard's part comes
first (`actors.ingest.crash_guard`), this one after ` answered `. A reader that knows nothing
of it (an older worker) sees only the crash guard's part and answers those records again
(at-least-once, as before).

Kafka keeps at most `offset.metadata.max.bytes` (4096 by default) of metadata per partition:
`fits()` says whether a set still fits, and the emitter holds a result back (until the commit
point catches up) rather than write more than that. The result at the commit point itself is
never held back (`RESERVE` is kept for it): it is what lets the commit point move on.

Pure logic, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

SEPARATOR = " answered "
MAX_METADATA_CHARS = 4000  # under Kafka's default offset.metadata.max.bytes (4096)
RESERVE = 64  # kept for the offset at the commit point (see `fits`)


class AnsweredOffsets:
    """A set of offsets as sorted, disjoint, non-adjacent ranges [first, last]."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self, offsets: Iterable[int] = ()) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []
        for offset in offsets:
            self.add(offset)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        i = bisect.bisect_right(self._firsts, offset) - 1
        return i >= 0 and offset <= self._lasts[i]

    def __len__(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges())

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnsweredOffsets) and self.ranges() == other.ranges()

    def __repr__(self) -> str:
        return f"AnsweredOffsets({self.ranges()!r})"

    def __iter__(self) -> Iterator[int]:
        for first, last in self.ranges():
            yield from range(first, last + 1)

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._firsts, self._lasts, strict=True))

    def copy(self) -> AnsweredOffsets:
        clone = AnsweredOffsets()
        clone._firsts, clone._lasts = list(self._firsts), list(self._lasts)
        return clone

    def add(self, offset: int) -> None:
        """Add one offset, merging it into its neighbours' ranges."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        firsts, lasts = self._firsts, self._lasts
        i = bisect.bisect_right(firsts, offset) - 1  # the range starting at or before it
        if i >= 0 and offset <= lasts[i]:
            return
        joins_left = i >= 0 and lasts[i] == offset - 1
        joins_right = i + 1 < len(firsts) and firsts[i + 1] == offset + 1
        if joins_left and joins_right:
            lasts[i] = lasts[i + 1]
            del firsts[i + 1], lasts[i + 1]
        elif joins_left:
            lasts[i] = offset
        elif joins_right:
            firsts[i + 1] = offset
        else:
            firsts.insert(i + 1, offset)
            lasts.insert(i + 1, offset)

    def prune_below(self, base: int) -> None:
        """Forget the offsets under `base` (the commit point passed them)."""
        i = bisect.bisect_left(self._lasts, base)  # the first range reaching `base`
        del self._firsts[:i], self._lasts[:i]
        if self._firsts and self._firsts[0] < base:
            self._firsts[0] = base

    def encode(self, base: int) -> str:
        """The offsets at or past `base` as `a-b,c,...` relative to it ('' when none)."""
        parts = []
        for first, last in self.ranges():
            if last < base:
                continue
            first = max(first, base)
            start, end = first - base, last - base
            parts.append(str(start) if start == end else f"{start}-{end}")
        return ",".join(parts)

    @classmethod
    def decode(cls, text: str, base: int) -> AnsweredOffsets:
        """The inverse of `encode`; a malformed part is a ValueError."""
        out = cls()
        for part in filter(None, text.split(",")):
            start, _, end = part.partition("-")
            first, last = int(start), int(end or start)
            if first < 0 or last < first:
                raise ValueError(f"bad range {part!r}")
            if out._lasts and base + first <= out._lasts[-1] + 1:
                raise ValueError(f"ranges out of order at {part!r}")
            out._firsts.append(base + first)
            out._lasts.append(base + last)
        return out


def join(guard_metadata: str, answered: AnsweredOffsets, base: int) -> str:
    """The commit metadata: the crash guard's part, then the answered offsets (if any)."""
    encoded = answered.encode(base)
    return f"{guard_metadata}{SEPARATOR}{encoded}" if encoded else guard_metadata


def split(metadata: str | None, base: int | None) -> tuple[str, AnsweredOffsets]:
    """The crash guard's part of a commit's metadata, and the answered offsets it names (none
    when `base`, the committed offset, is unknown or the part does not parse)."""
    text = metadata or ""
    guard, sep, encoded = text.partition(SEPARATOR)
    if not sep or base is None or base < 0:
        return guard, AnsweredOffsets()
    try:
        return guard, AnsweredOffsets.decode(encoded.strip(), base)
    except ValueError:
        return guard, AnsweredOffsets()


def take(
    ready: list[int], answered: AnsweredOffsets, guard_metadata: str, base: int
) -> tuple[list[int], AnsweredOffsets, bool]:
    """Of the `ready` offsets (ascending), those one transaction takes, while the metadata
    that names them answered fits; the answered set it writes (pruned below `base`); and
    whether one was held back for want of room (it waits for the commit point to move)."""
    answered = answered.copy()
    for i, offset in enumerate(ready):
        answered.add(offset)
        # The record at the commit point always goes (RESERVE is kept for it): once it is
        # answered the commit point moves, and the metadata shrinks.
        room = 0 if offset == base else RESERVE
        if not fits(guard_metadata, answered, base, room=room):
            answered = AnsweredOffsets(o for o in answered if o != offset)
            answered.prune_below(base)
            return ready[:i], answered, True
    answered.prune_below(base)
    return list(ready), answered, False


def fits(guard_metadata: str, answered: AnsweredOffsets, base: int, *, room: int = 0) -> bool:
    """Whether `join(...)` stays within what Kafka keeps, with `room` characters to spare."""
    return len(join(guard_metadata, answered, base)) <= MAX_METADATA_CHARS - room
