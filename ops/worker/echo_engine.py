"""EchoEngine: the engine's surface with no model behind it, for `tokenmill worker --engine echo`
in benchmarks; never for serving. Each request's output is its own prompt tokens (the first
`max_new_tokens`, all in one step; a shorter prompt whole, finish reason "stop"), so a worker
running it measures everything around the engine: Kafka, decoding, tokenizing, the actors."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gpu.admission import check_admission
from gpu.engine import Completion, EngineRequest, StepOutput, StepStats
from gpu.engine_config import EngineConfig
from gpu.errors import CheckpointError
from gpu.loading.model_config import load_hf_config
from gpu.loading.tokenizer import Tokenizer
from gpu.model_config import ModelConfig

_HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class EchoModel:
    """What the worker reads of a model (names, shapes, tokenizer); no weights, no device."""

    name: str
    digest: str  # "echo:sha256:<hex>" of the config and tokenizer: never the real model's
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((*self.config.eos_token_ids, *self.tokenizer.eos_token_ids)))


def load_echo_model(path: Path, *, name: str | None = None) -> EchoModel:
    """Config and tokenizer of an HF folder or a `.gguf` file (tensor data is never read);
    `CheckpointError` as `load_model` raises it."""
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
        for file in (path / f for f in _HF_FILES if (path / f).is_file()):
            h.update(file.read_bytes())
    else:
        raise CheckpointError(path, "not a checkpoint: expected a folder or a .gguf file")
    name = name or (path.stem if path.is_file() else path.name)
    return EchoModel(name, f"echo:sha256:{h.hexdigest()}", path, config, tokenizer)


class EchoEngine:
    """`Engine`'s surface (`add`, `step`, `abort`, `has_work`, `model`, `config`,
    `max_model_len`) computing nothing. Admission is the engine's own (`check_admission`);
    sampling parameters are checked, then ignored. A step finishes up to `max_num_seqs`
    requests, in arrival order."""

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
        check_admission(
            request, self.config, self.max_model_len, self.model.config.vocab_size, self.waiting
        )

    def prepare(self, request: EngineRequest) -> None:
        """Nothing to do: JSON constraints are ignored (the prompt is echoed)."""

    def add(self, request: EngineRequest) -> None:
        self.validate(request)
        arrival = request.arrival_time if request.arrival_time is not None else self.clock()
        self.waiting[request.request_id] = (request, arrival)

    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None:
        """Drop a waiting request; its completion has no tokens. None if it is unknown."""
        if (entry := self.waiting.pop(request_id, None)) is None:
            return None
        return self._completion(*entry, [], reason, None, self.clock())

    def has_work(self) -> bool:
        return bool(self.waiting)

    def _completion(
        self, r: EngineRequest, arrival: float, tokens: list[int], reason: str,
        first: float | None, at: float,
    ) -> Completion:  # fmt: skip
        text = self.model.tokenizer.decode(tokens) if tokens else ""
        one = Completion(r.request_id, len(r.prompt_token_ids), tokens, text, reason, arrival,
                         first, at, 0)  # fmt: skip
        # n > 1: every choice echoes the prompt, as the engine's `gpu.choices.merge` shapes it.
        return replace(one, choices=(one,) * r.params.n) if r.params.n > 1 else one

    def step(self) -> StepOutput:
        start_ns, now = time.time_ns(), self.clock()
        chosen = [self.waiting.pop(i) for i in list(self.waiting)[: self.config.max_num_seqs]]
        finished = []
        for request, arrival in chosen:
            tokens = list(request.prompt_token_ids[: request.params.max_new_tokens])
            reason = "length" if len(tokens) == request.params.max_new_tokens else "stop"
            finished.append(self._completion(request, arrival, tokens, reason, now, now))
        prompt = sum(len(r.prompt_token_ids) for r, _ in chosen)
        stats = StepStats(
            start_ns, time.time_ns(), num_seqs=len(chosen), num_prefill_tokens=prompt,
            num_decode_tokens=0, num_preempted=0, num_waiting=len(self.waiting), num_running=0,
            kv_blocks_used=0, kv_blocks_total=0,
        )  # fmt: skip
        new_tokens = [(c.request_id, t) for c in finished for t in c.token_ids]
        return StepOutput(new_tokens, finished, stats)
