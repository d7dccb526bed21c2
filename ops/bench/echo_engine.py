"""EchoEngine: the engine's surface with no model behind it. For benchmarks; never for serving.

It answers every request with its own prompt tokens (the first `max_new_tokens` of them, all in
one step), so a worker running it measures the ceiling of everything around the engine: Kafka,
decoding, tokenizing, bucketing, the actors, producing results. It reads a checkpoint's config
and tokenizer (what the ingest needs to check and tokenize requests) and never its weights.

    engine = EchoEngine(load_echo_model(path))
    engine.add(EngineRequest("a", [5, 6, 7], SamplingParams(max_new_tokens=2)))
    engine.step().finished[0].token_ids  -> [5, 6], finish_reason "length"

A prompt shorter than `max_new_tokens` comes back whole with finish reason "stop".
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu.engine import Completion, EngineRequest, StepOutput, StepStats, check_admission
from gpu.engine_config import EngineConfig
from gpu.errors import CheckpointError
from gpu.loading.model_config import load_hf_config
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import ModelConfig

_HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class EchoModel:
    """What the worker reads of a model (names, shapes, tokenizer); no weights, no device.

    `digest` starts with "echo:" so no result can pass for the real model's output.
    """

    name: str
    digest: str  # "echo:sha256:<hex>" over the config and tokenizer bytes it read
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((*self.config.eos_token_ids, *self.tokenizer.eos_token_ids)))


def load_echo_model(path: Path, *, name: str | None = None) -> EchoModel:
    """Config and tokenizer of an HF folder or a `.gguf` file; tensor data is never read.

    Raises `CheckpointError` as `gpu.loading.loader.load_model` does.
    """
    path = Path(path)
    h = hashlib.sha256()
    if path.is_file() and path.suffix == ".gguf":
        from gpu.loading.gguf import read_gguf_header  # gguf-py only when a GGUF is read

        config, tokenizer, header_bytes = read_gguf_header(path)
        with path.open("rb") as f:  # the header: metadata and tensor infos, not tensor data
            h.update(f.read(header_bytes))
    elif path.is_dir():
        config = load_hf_config(path)
        tokenizer = Tokenizer.from_hf_folder(path, eos_token_ids=config.eos_token_ids)
        for file in (path / f for f in _HF_FILES):
            if file.is_file():
                h.update(file.read_bytes())
    else:
        raise CheckpointError(path, "not a checkpoint: expected a folder or a .gguf file")
    return EchoModel(
        name=name or (path.stem if path.is_file() else path.name),
        digest=f"echo:sha256:{h.hexdigest()}",
        path=path,
        config=config,
        tokenizer=tokenizer,
    )


class EchoEngine:
    """`gpu.engine.Engine`'s surface (`add`, `step`, `abort`, `has_work`, `model`, `config`,
    `max_model_len`) computing nothing: each request's output is its own prompt tokens.

    Exists to measure the plumbing around the engine in benchmarks (`tokenmill worker --engine
    echo`, `tokenmill bench pipeline`); never serve with it. Admission is the engine's own
    (`check_admission`: lengths, sampling, vocabulary, duplicates); sampling parameters are
    checked, then ignored. A step finishes up to `config.max_num_seqs` requests, in arrival
    order.
    """

    def __init__(
        self,
        model: EchoModel,
        config: EngineConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.config = config = config or EngineConfig()
        self.max_model_len = config.resolved_max_model_len(model.config)
        self.clock = clock
        self.waiting: dict[str, tuple[EngineRequest, float]] = {}  # id → (request, arrival)

    def validate(self, request: EngineRequest) -> None:
        """Raise what `Engine.validate` would: the same admission rules."""
        check_admission(
            request, self.config, self.max_model_len, self.model.config.vocab_size, self.waiting
        )

    def prepare(self, request: EngineRequest) -> None:
        """Nothing to do: the echo engine ignores JSON constraints (it echoes the prompt)."""

    def add(self, request: EngineRequest) -> None:
        self.validate(request)
        arrival = request.arrival_time if request.arrival_time is not None else self.clock()
        self.waiting[request.request_id] = (request, arrival)

    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None:
        """Drop a waiting request; its completion has no tokens. None if it is unknown."""
        entry = self.waiting.pop(request_id, None)
        if entry is None:
            return None
        request, arrival = entry
        now = self.clock()
        return Completion(
            request_id=request_id,
            prompt_tokens=len(request.prompt_token_ids),
            token_ids=[],
            text="",
            finish_reason=reason,
            arrival_time=arrival,
            first_token_time=None,
            finish_time=now,
            num_preemptions=0,
        )

    def has_work(self) -> bool:
        return bool(self.waiting)

    def step(self) -> StepOutput:
        start_ns = time.time_ns()
        now = self.clock()
        chosen = list(self.waiting)[: self.config.max_num_seqs]
        new_tokens: list[tuple[str, int]] = []
        finished: list[Completion] = []
        prompt_tokens = 0
        for request_id in chosen:
            request, arrival = self.waiting.pop(request_id)
            prompt = request.prompt_token_ids
            tokens = list(prompt[: request.params.max_new_tokens])
            reason = "length" if len(tokens) == request.params.max_new_tokens else "stop"
            prompt_tokens += len(prompt)
            new_tokens += [(request_id, t) for t in tokens]
            finished.append(
                Completion(
                    request_id=request_id,
                    prompt_tokens=len(prompt),
                    token_ids=tokens,
                    text=self.model.tokenizer.decode(tokens),
                    finish_reason=reason,
                    arrival_time=arrival,
                    first_token_time=now,
                    finish_time=now,
                    num_preemptions=0,
                )
            )
        stats = StepStats(
            start_ns=start_ns,
            end_ns=time.time_ns(),
            num_seqs=len(chosen),
            num_prefill_tokens=prompt_tokens,
            num_decode_tokens=0,
            num_preempted=0,
            num_waiting=len(self.waiting),
            num_running=0,
            kv_blocks_used=0,
            kv_blocks_total=0,
        )
        return StepOutput(new_tokens, finished, stats)
