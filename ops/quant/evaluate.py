"""How well a model predicts a text: next-token log-probs at every position, and what is
measured from them (perplexity, KL divergence against a reference model, top-1 agreement).

`score` runs the text through the engine's own machinery (a `KVPool`, `ModelRunner.prepare`
over `ScheduledChunk`s of one `Sequence`), so the numbers are those of the attention and
linear kernels that serve: the text is cut into windows of `context` tokens, each a fresh
sequence prefilled in chunks of `chunk` tokens, and row i of a window predicts its token
i + 1 (each window's first token is predicted by nothing). `compare` does the same for two
models side by side, one chunk at a time, so a long text never holds its distributions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from gpu.backends.backend import Backend
from gpu.backends.native import NativeBackend
from gpu.backends.torch_backend import TorchBackend
from gpu.block_allocator import blocks_for
from gpu.kernels.native import cpu_kernels
from gpu.kv_pool import KVPool
from gpu.loading.loader import LoadedModel
from gpu.models.layers import long_rope_rows
from gpu.scheduler import ScheduledChunk
from gpu.sequence import SamplingParams
from gpu.sequence import Sequence as Seq

CONTEXT = 1024  # tokens a window attends to at most
CHUNK = 256  # tokens per forward: bounds the logits held at once to CHUNK × vocab floats
_BLOCK = 16


@dataclass(frozen=True)
class Scores:
    """One model's predictions of a text's tokens, one row per predicted token."""

    targets: torch.Tensor  # int64 [n] the token each row predicts
    target_logprobs: torch.Tensor  # float32 [n] log p(target)
    top1: torch.Tensor  # int64 [n] the most likely token of each row
    logprobs: torch.Tensor | None = None  # float32 [n, vocab] when kept (KL needs them)

    @classmethod
    def of(cls, logprobs: torch.Tensor, targets: torch.Tensor, keep: bool = True) -> Scores:
        """From log-softmax rows [n, vocab] and the tokens they predict [n]."""
        picked = logprobs.gather(1, targets[:, None])[:, 0]
        return cls(targets, picked, logprobs.argmax(-1), logprobs if keep else None)

    @property
    def tokens(self) -> int:
        return int(self.targets.numel())

    @staticmethod
    def cat(parts: Sequence[Scores]) -> Scores:
        kept = [p.logprobs for p in parts if p.logprobs is not None]
        return Scores(
            torch.cat([p.targets for p in parts]),
            torch.cat([p.target_logprobs for p in parts]),
            torch.cat([p.top1 for p in parts]),
            torch.cat(kept) if len(kept) == len(parts) else None,
        )


def perplexity(scores: Scores) -> float:
    """exp of the mean negative log-likelihood of the targets."""
    return math.exp(-float(scores.target_logprobs.double().mean()))


def kl_rows(
    reference: torch.Tensor,  # [n, vocab] log-probs
    other: torch.Tensor,  # [n, vocab] log-probs
) -> torch.Tensor:  # [n] KL(p_ref || p_other) per row, in nats
    kl = F.kl_div(other.double(), reference.double(), log_target=True, reduction="none").sum(-1)
    return kl.clamp_min(0.0)  # >= 0; float32 log-probs of equal distributions round to ±1e-9


def kl_divergence(reference: Scores, other: Scores) -> float:
    """Mean over positions of KL(p_reference || p_other), in nats."""
    if reference.logprobs is None or other.logprobs is None:
        raise ValueError("KL divergence needs both models' distributions (score(..., keep=True))")
    _same_rows(reference, other)
    return float(kl_rows(reference.logprobs, other.logprobs).mean())


def top1_agreement(reference: Scores, other: Scores) -> float:
    """Share of positions where both models' most likely next token is the same."""
    _same_rows(reference, other)
    return float((reference.top1 == other.top1).double().mean())


def _same_rows(a: Scores, b: Scores) -> None:
    if a.tokens != b.tokens or not torch.equal(a.targets, b.targets):
        raise ValueError(f"scores of different texts ({a.tokens} and {b.tokens} tokens)")


@dataclass(frozen=True)
class Comparison:
    """A model against a reference on one text."""

    tokens: int  # predicted positions
    reference_ppl: float
    ppl: float
    kl: float  # mean KL(p_reference || p), nats
    top1_agreement: float

    def to_dict(self) -> dict[str, float | int]:
        return {
            "tokens": self.tokens,
            "reference_ppl": self.reference_ppl,
            "ppl": self.ppl,
            "kl": self.kl,
            "top1_agreement": self.top1_agreement,
        }


def score(
    model: LoadedModel,
    token_ids: Sequence[int],
    *,
    keep: bool = True,
    context: int = CONTEXT,
    chunk: int = CHUNK,
) -> Scores:
    """The model's next-token log-probs over `token_ids`; `keep` holds every row's whole
    distribution ([n, vocab] float32: 192 KiB a token at a 49k vocabulary), else only what
    perplexity and top-1 agreement need."""
    parts = [Scores.of(lp, t, keep) for lp, t in logprob_chunks(model, token_ids, context, chunk)]
    return Scores.cat(parts)


def compare(
    reference: LoadedModel,
    model: LoadedModel,
    token_ids: Sequence[int],
    *,
    context: int = CONTEXT,
    chunk: int = CHUNK,
) -> Comparison:
    """`model` against `reference` over `token_ids`, chunk by chunk (no distributions kept)."""
    ref_lp: list[torch.Tensor] = []
    lp: list[torch.Tensor] = []
    kl: list[torch.Tensor] = []
    same: list[torch.Tensor] = []
    pairs = zip(
        logprob_chunks(reference, token_ids, context, chunk),
        logprob_chunks(model, token_ids, context, chunk),
        strict=True,
    )
    for (a, targets), (b, _) in pairs:
        ref_lp.append(a.gather(1, targets[:, None])[:, 0])
        lp.append(b.gather(1, targets[:, None])[:, 0])
        kl.append(kl_rows(a, b))
        same.append(a.argmax(-1) == b.argmax(-1))
    n = sum(t.numel() for t in lp)
    return Comparison(
        tokens=n,
        reference_ppl=math.exp(-float(torch.cat(ref_lp).double().mean())),
        ppl=math.exp(-float(torch.cat(lp).double().mean())),
        kl=float(torch.cat(kl).mean()),
        top1_agreement=float(torch.cat(same).double().mean()),
    )


@torch.inference_mode()
def logprob_chunks(
    model: LoadedModel, token_ids: Sequence[int], context: int = CONTEXT, chunk: int = CHUNK
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(log-softmax rows [n, vocab] float32 on the host, the tokens they predict [n]) for
    each chunk of each window, in text order."""
    ids = [int(t) for t in token_ids]
    if len(ids) < 2:
        raise ValueError(f"scoring needs at least 2 tokens, got {len(ids)}")
    config = model.config
    context = max(2, min(context, config.max_position_embeddings))
    blocks = blocks_for(min(context, len(ids)), _BLOCK)  # the pool holds one window
    kv = KVPool(config, blocks + 1, _BLOCK, blocks, model.dtype, model.device)
    windows = [w for i in range(config.num_layers) if (w := config.layer_window(i)) is not None]
    kernels = None
    if model.device.type == "cpu" and model.dtype == torch.float32:
        kernels = cpu_kernels()  # as the engine: the layers' fused native ops
    options: dict[str, Any] = {
        "window": max(windows) if windows else None,
        "long_rope": long_rope_rows(config),
    }
    backend: Backend = (
        TorchBackend(model.module, kv, model.device, **options)
        if kernels is None
        else NativeBackend(model.module, kv, kernels, model.device, **options)
    )
    for begin in range(0, len(ids) - 1, context):
        window = ids[begin : begin + context]
        if len(window) < 2:
            break
        seq = Seq("score", window, SamplingParams(), arrival_time=0.0)
        seq.block_table = list(range(1, blocks_for(len(window), _BLOCK) + 1))  # 0 pads
        for start in range(0, len(window) - 1, chunk):
            n = min(chunk, len(window) - start)
            inputs = backend.build([ScheduledChunk.of(seq, start, n)])
            predicting = min(n, len(window) - 1 - start)  # the window's last token: no target
            rows = torch.arange(predicting, device=model.device)
            logits = backend.run_model(replace(inputs, logits_rows=rows))  # [rows, vocab]
            targets = torch.tensor(window[start + 1 : start + 1 + predicting])
            yield torch.log_softmax(logits.float(), -1).cpu(), targets
