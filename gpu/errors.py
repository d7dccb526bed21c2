"""Every exception the engine raises, in one place.

Callers (the GPU actor, the CLI) match on these types to turn failures into typed error
results; each carries a message a user can act on.
"""

from __future__ import annotations

from collections.abc import Iterable

from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest


class EngineError(Exception):
    """Base class of everything `gpu/` raises on purpose."""


class CheckpointError(EngineError):
    """A checkpoint cannot be loaded: missing file, wrong shape, unsupported architecture.

    The message always names the file (or folder) and the problem.
    """

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnsupportedArchitecture(CheckpointError):
    """The checkpoint's architecture is not one the engine implements."""


class RequestRejected(EngineError, InvalidRequest):
    """A request the engine cannot admit. `code` is the `ErrorCode` of the rule it broke.

    The engine's side of `messages.errors.InvalidRequest`: the rules and codes are those of
    `messages.admission`, the ones the ingest checks, so one vocabulary serves both.
    """


class NoFreeBlocks(EngineError):
    """Raised by `BlockAllocator.allocate` on an empty pool; the scheduler checks first."""


class OutOfKVBlocks(EngineError):
    """The KV pool cannot hold even one sequence of `max_model_len`: a configuration error."""


class MemoryPlanError(EngineError):
    """The memory plan does not fit the device budget."""


class SmokeTestFailed(EngineError):
    """A freshly loaded model produced non-finite logits or no tokens on a tiny prompt."""


class SpeculativeConfigError(EngineError, ValueError):
    """A speculative decoding setting that cannot work: an unknown proposer, a k out of range,
    a draft model whose tokenizer is not the target's."""


class UnsupportedPipeline(UnsupportedArchitecture):
    """A sentence-transformers folder whose pipeline (`modules.json`) has a module or a setting
    the encoder does not implement (`gpu.encoder.pipeline`): the message names which."""


class UnknownPromptName(RequestRejected, KeyError):
    """An embedding request names a task prompt the model does not have
    (`gpu.encoder.inputs.embed_tokens`). A KeyError too: a lookup that missed."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        names = ", ".join(sorted(known)) or "none"
        super().__init__(
            ErrorCode.UNKNOWN_PROMPT_NAME,
            f"prompt_name {name!r} is not one of the model's task prompts ({names})",
        )
        self.name = name

    def __str__(self) -> str:  # the message, not KeyError's quoted repr of it
        return self.message
