"""A stand-in for `gpu.encoder`'s engine in the actors' unit tests: the `EngineLike` surface
and `embedding`, with vectors computed from the token ids in numpy (no model).

`CharTokenizer` tokenizes a text character by character between <bos> (2) and <eos> (1), so
a test can tell a task prompt's tokens and a cut input's by eye.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from gpu.encoder.spec import EmbeddingSpec
from gpu.engine_config import EngineConfig
from gpu.engine_io import Completion, EngineRequest, StepOutput, StepStats

BOS, EOS, VOCAB = 2, 1, 128
SPEC = EmbeddingSpec(
    dimensions=8,
    max_tokens=16,
    prompts={"query": "q: ", "document": "d: "},
    default_prompt_name=None,
)


class CharTokenizer:
    chat_template = None
    vocab_size = VOCAB

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = [3 + ord(c) % (VOCAB - 3) for c in text]
        return [BOS, *ids, EOS] if add_special_tokens else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def vector(tokens: list[int], width: int, dimensions: int | None = None) -> np.ndarray:
    """A unit vector that depends on every token and its place; cut to `dimensions`, again of
    unit length (Matryoshka)."""
    v = np.zeros(width, dtype=np.float32)
    for place, token in enumerate(tokens):
        v[(token + place) % width] += 1.0 + token / 100
    v = v[: dimensions or width]
    return (v / np.linalg.norm(v)).astype(np.float32)


class FakeEncoder:
    """Runs each request's inputs in one step, once it has been stepped `steps_needed` times."""

    def __init__(
        self,
        spec: EmbeddingSpec = SPEC,
        *,
        name: str = "fake-embed",
        steps_needed: int = 1,
        config: EngineConfig | None = None,
        path: Path | None = None,
        digest: str = "sha256:" + "cd" * 32,
    ) -> None:
        self.model = SimpleNamespace(
            name=name,
            digest=digest,
            path=path or Path("/nonexistent") / name,
            tokenizer=CharTokenizer(),
            config=SimpleNamespace(vocab_size=VOCAB),
            dtype=None,
            device=None,
        )
        self.config = config or EngineConfig()
        self.embedding = spec
        self.steps_needed = steps_needed
        self.waiting: dict[str, tuple[EngineRequest, int]] = {}  # id → (request, steps left)
        self.added: list[EngineRequest] = []

    def prepare(self, request: EngineRequest) -> None:
        pass

    def add(self, request: EngineRequest) -> None:
        if request.embed is None:
            raise ValueError("an encoder engine runs embedding requests only")
        self.added.append(request)
        self.waiting[request.request_id] = (request, self.steps_needed)

    def has_work(self) -> bool:
        return bool(self.waiting)

    def step(self) -> StepOutput:
        start = time.time_ns()
        finished = []
        for request_id, (request, left) in list(self.waiting.items()):
            if left > 1:
                self.waiting[request_id] = (request, left - 1)
                continue
            del self.waiting[request_id]
            finished.append(self._completion(request, "stop"))
        stats = StepStats(start, time.time_ns(), len(finished), 0, 0, 0, len(self.waiting),
                          0, 0, 0)  # fmt: skip
        return StepOutput(new_tokens=[], finished=finished, stats=stats)

    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None:
        held = self.waiting.pop(request_id, None)
        if held is None:
            return None
        return replace(self._completion(held[0], reason), embeddings=())

    def encode(self, inputs: list[list[int]], dimensions: int | None = None) -> list[np.ndarray]:
        return [vector(list(one), self.embedding.dimensions, dimensions) for one in inputs]

    def _completion(self, request: EngineRequest, reason: str) -> Completion:
        assert request.embed is not None
        now = time.monotonic()
        inputs = [list(one) for one in request.embed.inputs]
        return Completion(
            request_id=request.request_id,
            prompt_tokens=sum(len(one) for one in inputs),
            token_ids=[],
            text="",
            finish_reason=reason,
            arrival_time=request.arrival_time or now,
            first_token_time=None,
            finish_time=now,
            num_preemptions=0,
            embeddings=tuple(self.encode(inputs, request.embed.dimensions)),
        )
