"""Compile a `Constraint` against one model's vocabulary, once per distinct constraint."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpu.errors import RequestRejected
from gpu.grammar.matcher import GrammarMatcher
from gpu.loading.tokenizer import Tokenizer
from gpu.sequence import Constraint
from messages.error_codes import ErrorCode
from messages.limits import cut
from messages.tool_formats import auto_grammar, detect_format, markers, read_constraint

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions

CACHE_SIZE = 64  # distinct constraints kept compiled

# Compact JSON: no whitespace between tokens. With flexible whitespace a small model can
# emit newlines forever inside an object and never close it.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


class GrammarCompiler:
    """Builds `GrammarMatcher`s for one model. The library's view of the vocabulary (each token
    id's bytes, read from the tokenizer's own serialisation) is built on first use: an engine
    that never sees a constrained request never pays for it. That and compiling take a lock,
    so `prepare` may run on another thread than the engine's (ahead of `matcher`)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        """`vocab_size`: the width of the model's logits (at least the tokenizer's)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._compiled: OrderedDict[tuple[str, str, bool], llguidance.LLMatcher] = OrderedDict()
        self._library_tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def library_tokenizer(self) -> llguidance.LLTokenizer:
        """Seconds to build for a large vocabulary (Gemma 3's 262,144 tokens), once."""
        with self._lock:
            if self._library_tokenizer is None:
                # Imported here, not at the top: an engine that never sees a constrained
                # request runs where the library is not installed (tests/gpu/check.py).
                import llguidance

                self._library_tokenizer = llguidance.LLTokenizer(
                    self.tokenizer.inner.to_str(),
                    n_vocab=max(self.vocab_size, self.tokenizer.vocab_size),
                    eos_token=self.eos_token_ids or None,
                )
            return self._library_tokenizer

    @property
    def mask_words(self) -> int:
        """int32 words in one row's bitmask."""
        return (self.library_tokenizer.vocab_size + 31) // 32

    def matcher(self, constraint: Constraint) -> GrammarMatcher:
        """A fresh matcher at the start of `constraint`'s grammar, or `RequestRejected` with
        `INVALID_RESPONSE_FORMAT` if the library cannot compile it."""
        return GrammarMatcher(self.prepare(constraint).deep_copy())  # shares the compiled grammar

    def prepare(self, constraint: Constraint) -> llguidance.LLMatcher:
        """Compile `constraint` into the cache unless it is there (`matcher` then finds it);
        its template matcher, which is never advanced."""
        tokenizer = self.library_tokenizer
        key = (constraint.kind, constraint.text, constraint.strict)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
                return template
            template = self._compile(constraint, tokenizer)
            self._compiled[key] = template
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
            return template

    def _compile(
        self, constraint: Constraint, tokenizer: llguidance.LLTokenizer
    ) -> llguidance.LLMatcher:
        import llguidance

        try:
            if constraint.kind == "json":
                options: JsonCompileOptions = {**_JSON_OPTIONS, "lenient": not constraint.strict}
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    constraint.text, overrides=options
                )
            elif constraint.kind == "tools":
                lark = self.tools_grammar(constraint.text, tokenizer)
                grammar = llguidance.grammar_from("lark", lark)
            else:  # "regex", "choice" (a JSON list of strings), "grammar" (Lark or GBNF)
                grammar = llguidance.grammar_from(constraint.kind, constraint.text)
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, GBNF it cannot read, …
            raise _rejected(constraint, str(exc)) from None
        template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if template.is_error():
            raise _rejected(constraint, template.get_error())
        return template

    def tools_grammar(self, text: str, library: llguidance.LLTokenizer) -> str:
        """The Lark grammar of a "tools" constraint for this model: its chat template's
        tool-call format, a marker matched as its token where the library holds that token
        apart from text (a special or added token: its text alone cannot match it).
        `library`: the library's view of the vocabulary (`library_tokenizer`; passed, as its
        property takes the lock the compile holds)."""
        functions, parallel, lenient = read_constraint(text)
        fmt = detect_format(self.tokenizer.chat_template)
        special = {}
        for marker in markers(fmt):
            ids = self.tokenizer.encode(marker, add_special_tokens=False)
            if len(ids) == 1 and library.is_special_token(ids[0]):
                special[marker] = ids[0]
        return auto_grammar(fmt, functions, parallel=parallel, special=special, lenient=lenient)


_WHAT = {
    "json": "the JSON schema",
    "regex": "the regex",
    "choice": "the choice",
    "grammar": "the grammar",
    "tools": "the tools' schemas",
}


def _rejected(constraint: Constraint, problem: str) -> RequestRejected:
    """The library's message is several lines (the source, a caret): its first line, and the
    line saying what is wrong where one does, each cut short (they may quote the source)."""
    lines = [cut(line.strip(), 200) for line in problem.strip().splitlines() if line.strip()]
    said = lines[:1] + [line for line in lines[1:] if line.startswith("error:")][:1]
    return RequestRejected(
        ErrorCode.INVALID_RESPONSE_FORMAT,
        f"{_WHAT[constraint.kind]} cannot be compiled: {' '.join(said) or 'unknown error'}",
    )
