"""InFlight: what the GPU actor keeps of each request an engine is running.

One record per running request id, so nothing is kept in step by hand: the engine that runs
it, the model its result names, when it was admitted, whether it was already queued again
after a crash, and its copies (the same id consumed again while it runs: a redelivery, a
client's retry), which are answered with its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.mail import Admitted
from gpu.engine import Completion, EngineRequest, StepOutput
from messages.result import ModelRef


class EngineLike(Protocol):
    """What the GPU actor needs of an engine (`gpu.engine.Engine`, the benchmark's echo engine)."""

    model: Any  # .name, .digest, .path, .tokenizer, .config
    config: Any  # its EngineConfig

    def add(self, request: EngineRequest) -> None: ...
    def step(self) -> StepOutput: ...
    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None: ...
    def has_work(self) -> bool: ...


@dataclass(slots=True)
class InFlight:
    item: Admitted
    engine: EngineLike  # the engine running it
    model: ModelRef  # the model its result names
    admitted_at: float  # monotonic seconds
    requeued: bool = False  # queued again after a crash: a second crash fails it
    copies: list[Admitted] = field(default_factory=list)

    @property
    def everyone(self) -> list[Admitted]:
        """The request and its copies: each gets the result."""
        return [self.item, *self.copies]
