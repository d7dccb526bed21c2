"""A freshly loaded engine's smoke test: a few greedy tokens on a tiny prompt, finite logits.

Run before a swapped-in model serves anything. It uses the engine's own `add`/`step` path, so
it exercises the KV pool, the scheduler and sampling as serving will; the logits are checked
by wrapping the backend's forward for the duration of the test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from gpu.engine import EngineRequest
from gpu.errors import SmokeTestFailed
from gpu.sequence import SamplingParams

SMOKE_PROMPT = "Hello"
SMOKE_TOKENS = 4
_SMOKE_ID = "tokenmill-smoke-test"


@dataclass(frozen=True)
class SmokeReport:
    tokens: list[int]
    ms: float


class _FiniteLogits:
    """Wraps a causal LM: forwards every call, remembers whether any logit was not finite."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.finite = True

    def __call__(self, *args: Any) -> torch.Tensor:
        logits: torch.Tensor = self.model(*args)
        self.finite = self.finite and bool(torch.isfinite(logits).all())
        return logits


def smoke_test(engine: Any, *, max_steps: int = 64) -> SmokeReport:
    """Generate `SMOKE_TOKENS` greedy tokens; raise `SmokeTestFailed` saying what went wrong.

    The engine must be idle and not yet shared (it runs on the caller's thread).
    """
    start = time.perf_counter()
    prompt = engine.model.tokenizer.encode(SMOKE_PROMPT) or [0]
    backend: Any = getattr(engine, "backend", None)  # the echo engine has none
    check = _FiniteLogits(backend.forward) if backend is not None else None
    if check is not None:
        backend.forward = check  # an instance attribute over the method, for the test
    try:
        engine.add(
            EngineRequest(
                request_id=_SMOKE_ID,
                prompt_token_ids=prompt,
                params=SamplingParams(max_new_tokens=SMOKE_TOKENS, temperature=0.0),
            )
        )
        for _ in range(max_steps):
            out = engine.step()
            done = [c for c in out.finished if c.request_id == _SMOKE_ID]
            if done:
                tokens = done[0].token_ids
                break
        else:
            engine.abort(_SMOKE_ID)
            raise SmokeTestFailed(f"no answer to a {len(prompt)}-token prompt in {max_steps} steps")
    except SmokeTestFailed:
        raise
    except Exception as exc:  # any failure of a fresh model is a failed smoke test
        raise SmokeTestFailed(f"the model failed on a tiny prompt: {exc!r}") from exc
    finally:
        if check is not None:
            del backend.forward
    if check is not None and not check.finite:
        raise SmokeTestFailed("the model produced non-finite logits (NaN or inf weights?)")
    if not tokens:
        raise SmokeTestFailed("the model generated no tokens")
    return SmokeReport(tokens=tokens, ms=(time.perf_counter() - start) * 1e3)
