"""Rebuilding a streamed request's text from its chunks, as a consumer of the reply topic does.

Chunks come at least once and, after a failed send was sent again, perhaps out of order; so
they are put in `seq` order, a `seq` seen before is dropped, and a gap waits for the chunk
that fills it. A new `run` (the request was run again) starts over. The result has the last
word: what it has beyond the text shown is shown at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from messages.chunk import GenerateChunk
from messages.result import GenerateResult


@dataclass
class StreamedText:
    """One request's text as its chunks arrive: `add` and `finish` return what to show next."""

    run: str | None = None
    next_seq: int = 0
    shown: str = ""
    restarted: bool = False  # a chunk of another run came: what was shown is not the answer
    _early: dict[int, GenerateChunk] = field(default_factory=dict)

    def add(self, chunk: GenerateChunk) -> str:
        """The text `chunk` (and any chunks it was the gap before) adds, in order."""
        return "".join(c.text for c in self.ready(chunk))

    def ready(self, chunk: GenerateChunk) -> list[GenerateChunk]:
        """The chunks `chunk` lets through, in order: itself and those it was the gap before
        (none when it is a duplicate or comes before a gap)."""
        if chunk.run != self.run:
            if self.run is not None:
                self.restarted = True
            self.run, self.next_seq, self._early = chunk.run, 0, {}
            self.shown = ""
        if chunk.seq < self.next_seq:
            return []  # a duplicate
        self._early[chunk.seq] = chunk
        out = []
        while (ready := self._early.pop(self.next_seq, None)) is not None:
            out.append(ready)
            self.next_seq += 1
        self.shown += "".join(c.text for c in out)
        return out

    def finish(self, result: GenerateResult) -> str | None:
        """What the result adds beyond the text shown (normally ""), or None when the shown
        text is not the start of the result's (then show the result's text whole)."""
        if self.restarted or not result.text.startswith(self.shown):
            return None
        return result.text[len(self.shown) :]
