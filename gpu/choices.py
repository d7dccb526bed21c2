"""`n` choices of one request: `n` sequences over its prompt, and one completion for them.

    groups = ChoiceGroups()
    for child in groups.split(request):      # n > 1: n requests, ids "<id>#<i>"; else itself
        ...add child...
    finished = groups.gather(finished)       # a child's completion waits for its siblings'
    groups.children_of(request_id)           # what to abort for a request
    parent_of(sequence_id)                   # (request id, choice index) of a child's id

The children share the prompt's KV blocks through the prefix cache: they are added together,
the first computes each full block of the prompt and the others wait for it and take it
(`Scheduler._admit`'s in-flight rule), so the prompt is prefilled once and only its last,
partial block is computed by each child. Without prefix caching (sliding windows, LongRoPE,
`--no-prefix-caching`) each child prefills the prompt itself: the same tokens, more work.

Choice `i` samples with its own seed: choice 0 with the request's, choice `i` with a mix of the
request's and `i` (`choice_seed`), so a seeded request gives the same `n` choices every time,
and they differ from each other.

Pure Python: no torch, and not the engine's module (which imports this one): requests and
completions are whatever has their fields (`ChoiceRequest`, `ChoiceCompletion`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from gpu.sequence import SamplingParams


class ChoiceRequest(Protocol):
    """`gpu.engine.EngineRequest`'s fields this module reads (a dataclass)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def request_id(self) -> str: ...
    @property
    def params(self) -> SamplingParams: ...


class ChoiceCompletion(Protocol):
    """`gpu.engine.Completion`'s fields this module reads (a dataclass)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def request_id(self) -> str: ...
    @property
    def first_token_time(self) -> float | None: ...
    @property
    def finish_time(self) -> float: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def num_kv_blocks(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def draft_tokens(self) -> int: ...
    @property
    def accepted_draft_tokens(self) -> int: ...


R = TypeVar("R", bound=ChoiceRequest)
C = TypeVar("C", bound=ChoiceCompletion)

_SEED_MASK = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # an odd constant with well-mixed bits (2^64 / golden ratio)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request seeded with `seed` (None: unseeded)."""
    if seed is None or index == 0:
        return seed
    return ((seed & _SEED_MASK) ^ (index * _GOLDEN)) & _SEED_MASK


def child_id(request_id: str, index: int) -> str:
    return f"{request_id}#{index}"


def parent_of(sequence_id: str) -> tuple[str, int] | None:
    """The request id and choice index that `child_id` made `sequence_id` of; None when it
    cannot be a child's (a caller that knows a request by `sequence_id` itself asks first)."""
    parent, sep, index = sequence_id.rpartition("#")
    if not sep or not (index.isascii() and index.isdigit()):
        return None
    return parent, int(index)


@dataclass
class _Group(Generic[C]):
    request_id: str
    n: int
    done: dict[int, C] = field(default_factory=dict)  # by choice index

    def children(self) -> Iterator[str]:
        return (child_id(self.request_id, i) for i in range(self.n))


class ChoiceGroups(Generic[C]):
    """The requests with `n` > 1 that the engine runs, as groups of child sequences."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group[C]] = {}
        self._parent: dict[str, tuple[_Group[C], int]] = {}  # child id → (its group, its index)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._groups

    def split(self, request: R) -> list[R]:
        """The requests the engine adds for `request`: itself when `n` is 1, else `n` children
        (ids `child_id(id, i)`, `n` 1, seeds `choice_seed`)."""
        n = request.params.n
        if n == 1:
            return [request]
        group: _Group[C] = _Group(request.request_id, n)
        self._groups[request.request_id] = group
        children = []
        for i in range(n):
            params = replace(request.params, n=1, seed=choice_seed(request.params.seed, i))
            if i:  # the prompt's logprobs are the request's: choice 0 scores them, and the
                # others may then take its prompt blocks from the prefix cache
                params = replace(params, prompt_logprobs=None)
            children.append(
                replace(request, request_id=child_id(request.request_id, i), params=params)
            )
            self._parent[children[-1].request_id] = (group, i)
        return children

    def ids(self, request: ChoiceRequest) -> list[str]:
        """The sequence ids `split` would give `request` (to check none is running yet)."""
        n = request.params.n
        return (
            [request.request_id] if n == 1 else [child_id(request.request_id, i) for i in range(n)]
        )

    def children_of(self, request_id: str) -> list[str]:
        """The ids of `request_id`'s children still running (itself when it has none)."""
        group = self._groups.get(request_id)
        if group is None:
            return [request_id]
        return [c for i, c in enumerate(group.children()) if i not in group.done]

    def gather(self, finished: Iterable[C]) -> list[C]:
        """`finished` with each child's completion held back until its group is complete, when
        the group's one completion (`merge`) takes its place."""
        out = []
        for completion in finished:
            found = self._parent.get(completion.request_id)
            if found is None:
                out.append(completion)
                continue
            group, index = found
            group.done[index] = completion
            if len(group.done) == group.n:
                out.append(self._close(group))
        return out

    def _close(self, group: _Group[C]) -> C:
        del self._groups[group.request_id]
        for child in group.children():
            del self._parent[child]
        return merge(group.request_id, [group.done[i] for i in range(group.n)])


def merge(request_id: str, choices: list[C]) -> C:
    """One completion for a request's `choices` (index order): the first choice's tokens, text
    and finish reason at the top, every choice in `choices`. The prompt is counted once: its
    cached tokens are those the cache served every choice (what the prefix cache held before
    the request: the choices' sharing shows in the engine's step statistics); the KV blocks
    (shared ones in each choice) and preemptions are summed."""
    first = choices[0]
    started = [c.first_token_time for c in choices if c.first_token_time is not None]
    return replace(
        first,
        request_id=request_id,
        first_token_time=min(started) if started else None,
        finish_time=max(c.finish_time for c in choices),
        num_preemptions=sum(c.num_preemptions for c in choices),
        num_kv_blocks=sum(c.num_kv_blocks for c in choices),
        cached_tokens=min(c.cached_tokens for c in choices),
        draft_tokens=sum(c.draft_tokens for c in choices),
        accepted_draft_tokens=sum(c.accepted_draft_tokens for c in choices),
        choices=tuple(replace(c, request_id=request_id) for c in choices),
    )
