"""Incremental detokenization: the text of a growing token sequence, a window at a time.

A byte-level BPE token can end inside a UTF-8 character, and decoding such a prefix yields
U+FFFD where the character will be; so only text up to the last complete character is
given out, and the tokens after the last such boundary are decoded again with the next one.
A few tokens before the boundary are decoded with the window, as context: tokenizers whose
decoders treat the first token specially (SentencePiece's leading space) then give the same
text as decoding the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]

REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 4


class IncrementalText:
    """Tokens appended one at a time; `text()` is theirs up to the last complete character."""

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self.tokens: list[int] = []
        self._boundary = 0  # tokens[:_boundary] decode to _done, which ends on a whole character
        self._done = ""

    def append(self, token: int) -> None:
        self.tokens.append(token)

    def text(self) -> str:
        """The text of every token so far, without a trailing incomplete character.

        Costs one decode of the tokens since the last complete character (plus context), so a
        stream costs O(output), not O(output²). A U+FFFD the model really produced at the end
        is held back too, until a later token follows it (or the result says the rest).
        """
        window = self.tokens[self._boundary :]
        if not window:
            return self._done
        context = self.tokens[max(0, self._boundary - _CONTEXT_TOKENS) : self._boundary]
        head = self._decode(context) if context else ""
        both = self._decode([*context, *window])
        if both.startswith(head):
            done, tail = self._done, both[len(head) :]
        else:  # the context reads differently once followed: decode from the start
            done, tail = "", self._decode(self.tokens)
        if tail.endswith(REPLACEMENT):
            return done + tail.rstrip(REPLACEMENT)
        self._boundary, self._done = len(self.tokens), done + tail
        return self._done
