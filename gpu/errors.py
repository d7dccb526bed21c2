"""Every exception the engine raises, in one place.

Callers (the GPU actor, the CLI) match on these types to turn failures into typed error
results; each carries a message a user can act on.
"""

from __future__ import annotations


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


class RequestRejected(EngineError):
    """A request cannot be admitted. `code` is one of the documented error codes."""

    code = "invalid_request"


class PromptTooLong(RequestRejected):
    code = "prompt_too_long"


class MaxTokensTooLarge(RequestRejected):
    code = "max_tokens_too_large"


class InvalidSamplingParams(RequestRejected):
    code = "invalid_sampling_params"


class TokenOutOfVocabulary(RequestRejected):
    code = "token_out_of_vocabulary"


class DuplicateRequest(RequestRejected):
    code = "duplicate_request"


class EmptyPrompt(RequestRejected):
    code = "empty_prompt"


class NoFreeBlocks(EngineError):
    """Raised by `BlockAllocator.allocate` on an empty pool; the scheduler checks first."""


class OutOfKVBlocks(EngineError):
    """The KV pool cannot hold even one sequence of `max_model_len`: a configuration error."""


class MemoryPlanError(EngineError):
    """The memory plan does not fit the device budget."""


class SmokeTestFailed(EngineError):
    """A freshly loaded model produced non-finite logits or no tokens on a tiny prompt."""
