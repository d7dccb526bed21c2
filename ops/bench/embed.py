"""`tokenmill bench embed`: tokenmill's encoder against sentence-transformers (and vLLM's CPU
build, where it runs) on the same texts, the same folder and the same CPU threads.

    report = run_embed_bench(EmbedBenchOptions(), say)

Contenders, each timed from texts to vectors (tokenizing included):
- `tokenmill`: the encoder engine driven as the worker drives it: one `EngineRequest` per text
  (`prepare`, `add`), then `step()` until no work is left, each step packing inputs up to the
  worker's token budget (`max_num_batched_tokens`);
- `tokenmill-direct` (`direct=True`): the engine's synchronous `encode` on all the inputs;
- `sentence-transformers`: `SentenceTransformer(folder, device=...).encode(texts, batch_size=B)`
  at the B of the most texts/s on a sample;
- `vllm` (`vllm_python` given): `LLM(model=folder, runner="pooling").embed(texts)` in a child
  process of that interpreter (`ops/bench/embed_vllm.py`); when it cannot run, why goes in
  the report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu.engine_config import EngineConfig
from gpu.engine_io import EmbedJob, EngineRequest
from ops.bench.embed_rounds import Contender, best_batch_size, compare, run_rounds
from ops.bench.embed_texts import describe, make_texts
from ops.bench.report import Narrate, Report

OURS = "tokenmill"
DIRECT = "tokenmill-direct"
ST = "sentence-transformers"
VLLM = "vllm"
Tokenize = Callable[[str], list[int]]  # a text → its input's final tokens


@dataclass(frozen=True)
class EmbedBenchOptions:
    model: str = "embeddinggemma-300m"
    texts: int = 1000
    seed: int = 0
    rounds: int = 2
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64)
    sample: int = 100  # texts of the batch-size sweep (another seed's)
    max_num_batched_tokens: int = EngineConfig().max_num_batched_tokens  # the worker's default
    prompt_name: str | None = None
    device: str = "cpu"
    direct: bool = False
    vllm_python: Path | None = None


class EngineContender:
    """tokenmill's encoder engine, through the API the worker's GPU actor uses."""

    def __init__(self, engine: Any, tokenize: Tokenize, *, direct: bool = False) -> None:
        self.name = DIRECT if direct else OURS
        self.engine = engine
        self.tokenize = tokenize
        self.direct = direct  # the engine's synchronous `encode`, not add/step

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        inputs = [self.tokenize(text) for text in texts]
        if self.direct:
            return np.stack(self.engine.encode(inputs))
        for i, ids in enumerate(inputs):
            request = EngineRequest(str(i), ids, embed=EmbedJob((ids,)))
            self.engine.prepare(request)
            self.engine.add(request)
        vectors: dict[str, np.ndarray] = {}
        while self.engine.has_work():
            for done in self.engine.step().finished:
                vectors[done.request_id] = done.embeddings[0]
        return np.stack([vectors[str(i)] for i in range(len(inputs))])


def ingest_tokenizer(engine: Any, prompt_name: str | None) -> Tokenize:
    """A text with its task prompt, tokenized and cut to the model's length as the worker's
    ingest does (truncate "end")."""
    from gpu.encoder.inputs import embed_tokens, fit

    spec, tokenizer = engine.embedding, engine.model.tokenizer

    def tokenize(text: str) -> list[int]:
        tokens = embed_tokens(tokenizer, spec, text, prompt_name)
        ids: list[int] = fit(tokens, spec.max_tokens, "end", spec.specials)[0]
        return ids

    return tokenize


class SentenceTransformersContender:
    def __init__(self, model: Any, batch_size: int, prompt_name: str | None) -> None:
        self.name = ST
        self.model = model
        self.batch_size = batch_size
        self.prompt_name = prompt_name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(
            self.model.encode(
                list(texts),
                batch_size=self.batch_size,
                prompt_name=self.prompt_name,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )


def run_embed_bench(options: EmbedBenchOptions, say: Narrate) -> Report:
    """Load the folder into tokenmill's encoder and sentence-transformers (and vLLM's child,
    when asked), then `measure`."""
    from sentence_transformers import SentenceTransformer

    from gpu.encoder import load_encoder_engine
    from ops.models.registry import resolve_model

    folder = resolve_model(options.model)
    config = EngineConfig(max_num_batched_tokens=options.max_num_batched_tokens)
    say(f"loading {folder} into tokenmill's encoder and sentence-transformers")
    engine = load_encoder_engine(folder, device=options.device, config=config)
    st_model = SentenceTransformer(str(folder), device=options.device)
    tokenize = ingest_tokenizer(engine, options.prompt_name)
    if options.vllm_python is None:
        return measure(options, engine, tokenize, st_model, None, say)
    from ops.bench.embed_vllm import VllmContender

    prefix = engine.embedding.prompts[options.prompt_name] if options.prompt_name else ""
    vllm = VllmContender.start(options.vllm_python, folder, prefix, say, threads=_threads())
    try:
        return measure(options, engine, tokenize, st_model, vllm, say)
    finally:
        vllm.close()


def measure(
    options: EmbedBenchOptions, engine: Any, tokenize: Tokenize, st_model: Any,
    vllm: Any | None, say: Narrate,
) -> Report:  # fmt: skip
    """sentence-transformers' best batch size on a sample, then every contender's rounds on
    the texts, and the report: rates, ratios to tokenmill, cosine agreement, targets."""
    report = Report("embed")
    built = make_texts(options.texts, options.seed)
    texts = [t.text for t in built]
    sample = [t.text for t in make_texts(options.sample, options.seed + 1)]
    token_counts = [len(tokenize(text)) for text in texts]
    report["texts"] = {"seed": options.seed, **describe(built, token_counts)}
    report["setup"] = {
        "model": options.model, "device": options.device, "threads": _threads(),
        "isa": _isa(), "prompt_name": options.prompt_name,
        "max_num_batched_tokens": options.max_num_batched_tokens, "rounds": options.rounds,
    }  # fmt: skip

    def st_at(size: int) -> Contender:
        return SentenceTransformersContender(st_model, size, options.prompt_name)

    say(f"sentence-transformers: batch sizes {list(options.batch_sizes)} on {len(sample)} texts")
    size, rates = best_batch_size(st_at, options.batch_sizes, sample, say)
    report["st_batch_sizes"] = {"sample_texts": len(sample), "texts_per_s": rates, "best": size}
    contenders: list[Contender] = [EngineContender(engine, tokenize), st_at(size)]
    if options.direct:
        contenders.append(EngineContender(engine, tokenize, direct=True))
    if vllm is not None:
        report["vllm"] = vllm.status
        if vllm.running:
            contenders.append(vllm)
    timings = run_rounds(contenders, texts, options.rounds, say)
    report["contenders"] = compare(timings, len(texts), sum(token_counts), OURS)
    return _conclude(report)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _isa() -> str:
    """The widest vector instructions torch's CPU kernels use here (e.g. "AVX512")."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def _conclude(report: Report) -> Report:
    """Targets (issue 48: ≥ 2× sentence-transformers, ≥ 1.2× vLLM) and the headline lines."""
    sections = report["contenders"]
    for name, figures in sections.items():
        text = f"{figures['texts_per_s']} texts/s · {figures['tokens_per_s']} tokens/s"
        if f"{OURS}_ratio" in figures:
            text += f" · {OURS} ×{figures[f'{OURS}_ratio']}"
        if agreement := figures.get(f"agreement_with_{OURS}"):
            text += f" · min cosine {agreement['min_cosine']}"
        report.headline(name, text)
    report.target("vs_sentence_transformers", sections[ST][f"{OURS}_ratio"], 2.0)
    vllm = sections.get(VLLM, {}).get(f"{OURS}_ratio")
    report.target("vs_vllm", vllm, 1.2)
    agreement = sections[ST][f"agreement_with_{OURS}"]["min_cosine"]
    report.target("min_cosine_vs_sentence_transformers", agreement, 0.9999)
    return report.finish()
