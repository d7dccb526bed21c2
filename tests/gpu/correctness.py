"""The GPU check's first phase: the tiny test models on a device against the CPU reference.

Every tiny random model of `tests/tiny_models.py`, greedy, one prompt at a time: on the device
in float32 the tokens must equal the CPU float32 reference's; in bfloat16 the logits must be
close (max |diff| within `BF16_TOLERANCE` of the reference's largest |logit|, over the steps
before the greedy tokens first part) and the greedy agreement (the share of tokens before
they part) is reported.

bfloat16 itself moves some models further than that: a router whose top experts nearly tie
in float32 picks another expert in bfloat16 (Qwen3-MoE's tiny model: a logit moves by 0.17 at
a scale of 3.3, and its greedy tokens part after one, in transformers' bfloat16 exactly as in
tokenmill's, on the CPU). So transformers runs the same prompts in bfloat16 on the same device
(`transformers_bf16`), measured against the same reference, and tokenmill's bfloat16 passes
when it is within the tolerance or no further from the reference than `DTYPE_MARGIN` times
transformers' own distance. Imports what `tests/gpu/check.py` may (see there).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams

BF16_TOLERANCE = 0.05  # of the reference's largest |logit|
DTYPE_MARGIN = 1.5  # times transformers' own bfloat16 distance from the float32 reference
CORRECTNESS_NEW_TOKENS = 16


class PhaseTimeout(Exception):
    """A phase ran past what was left of the check's time budget."""


class LogitsRecorder:
    """Stands in for the backend's forward: forwards each call, keeps the logits on the host."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.rows: list[torch.Tensor] = []

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        logits: torch.Tensor = self.model(*args, **kwargs)
        self.rows.append(logits.detach().float().cpu())
        return logits


def greedy(model: LoadedModel, prompt: list[int], new_tokens: int) -> tuple[list[int], Any]:
    """`prompt` alone, greedy, EOS ignored: its tokens and each step's logits ([steps, vocab],
    None when the backend's forward could not be watched)."""
    engine = Engine(model, EngineConfig(max_num_seqs=2, num_kv_blocks=32, max_model_len=256))
    backend: Any = engine.backend
    recorder = LogitsRecorder(backend.forward)
    backend.forward = recorder  # an instance attribute over the method
    graphs = backend.graphs  # decode steps replayed as CUDA graphs bypass the forward
    if graphs is not None:
        replay = graphs.run

        def watched(size: int, staged: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = replay(size, staged)
            recorder.rows.append(logits[:1].detach().float().cpu())  # the one real row
            return logits

        graphs.run = watched
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0)
    engine.add(EngineRequest("check", prompt, params))
    tokens: list[int] = []
    with torch.inference_mode():
        while engine.has_work():
            tokens += [t for _, t in engine.step().new_tokens]
    rows = recorder.rows
    logits = torch.cat(rows) if rows and sum(r.shape[0] for r in rows) == len(tokens) else None
    return tokens, logits


def transformers_greedy(
    folder: Path, device: torch.device, dtype: torch.dtype, prompt: list[int], new_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation of `prompt` (EOS ignored) and each step's logits
    ([steps, vocab], float32 on the host)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    hf = hf.to(device).eval()
    hf.generation_config.eos_token_id = None
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt], device=device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = [int(t) for t in out.sequences[0, len(prompt) :]]
    return tokens, torch.cat([step.float().cpu() for step in out.logits])


def compare(reference: tuple[list[int], Any], got: tuple[list[int], Any]) -> dict[str, Any]:
    ref_tokens, ref_logits = reference
    tokens, logits = got
    same = next(
        (i for i, (a, b) in enumerate(zip(ref_tokens, tokens, strict=False)) if a != b), len(tokens)
    )
    result: dict[str, Any] = {
        "tokens_equal": tokens == ref_tokens,
        "agreeing_prefix": same,
        "tokens": len(ref_tokens),
        "logits_max_abs_diff": None,
        "logits_scale": None,
    }
    if ref_logits is not None and logits is not None:
        upto = min(same + 1, len(tokens))  # steps whose inputs were the same tokens
        diff = (ref_logits[:upto] - logits[:upto]).abs().max().item()
        result["logits_max_abs_diff"] = diff
        result["logits_scale"] = ref_logits[:upto].abs().max().item()
    return result


def correctness(device: torch.device, archs: tuple[str, ...]) -> dict[str, Any]:
    from tests.tiny_models import build_tiny_checkpoint

    models: dict[str, Any] = {}
    ok = True
    with tempfile.TemporaryDirectory(prefix="tokenmill-gpu-check-") as tmp:
        for arch in archs:
            models[arch] = entry = {}
            try:
                folder = build_tiny_checkpoint(arch, Path(tmp) / arch)
                entry.update(_check_arch(folder, device))
            except PhaseTimeout:
                raise
            except Exception as exc:  # one architecture's failure is recorded, the rest run
                entry["error"] = f"{type(exc).__name__}: {exc}"
            ok = ok and entry.get("ok", False)
    return {"ok": ok, "device": str(device), "bf16_tolerance": BF16_TOLERANCE, "models": models}


def _check_arch(folder: Path, device: torch.device) -> dict[str, Any]:
    from tests.tiny_models import CORPUS

    cpu = load_model(folder, device="cpu", dtype=torch.float32)
    text = " ".join(CORPUS[:6])
    ids = cpu.tokenizer.encode(text)
    prompts = [ids[:20], ids[20:60]]  # the second past the gemma windows and phi3's switch
    reference = [greedy(cpu, p, CORRECTNESS_NEW_TOKENS) for p in prompts]
    del cpu
    result: dict[str, Any] = {"prompts": [len(p) for p in prompts]}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_model(folder, device=device, dtype=dtype)
        runs = [
            compare(r, greedy(model, p, CORRECTNESS_NEW_TOKENS))
            for r, p in zip(reference, prompts, strict=True)
        ]
        del model
        summary = summarize(runs)
        if dtype == torch.float32:
            summary["ok"] = summary["tokens_equal"]
            result["float32"] = summary
        else:
            n = CORRECTNESS_NEW_TOKENS
            own = summarize(
                [
                    compare(r, transformers_greedy(folder, device, dtype, p, n))
                    for r, p in zip(reference, prompts, strict=True)
                ]
            )
            summary["transformers_bf16"] = own
            summary["logits_close"] = bf16_close(summary, own)
            summary["ok"] = bool(summary["logits_close"])
            result["bfloat16"] = summary
    result["ok"] = result["float32"]["ok"] and result["bfloat16"]["ok"]
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's runs against the reference, in one summary."""
    diffs = [r["logits_max_abs_diff"] for r in runs if r["logits_max_abs_diff"] is not None]
    scales = [r["logits_scale"] for r in runs if r["logits_scale"] is not None]
    return {
        "runs": runs,
        "tokens_equal": all(r["tokens_equal"] for r in runs),
        "greedy_agreement": sum(r["agreeing_prefix"] for r in runs)
        / sum(r["tokens"] for r in runs),
        "logits_max_abs_diff": max(diffs) if diffs else None,
        "logits_scale": max(scales) if scales else None,
        "logits_captured": bool(diffs),
    }


def bf16_close(ours: dict[str, Any], transformers: dict[str, Any]) -> bool | None:
    """Whether tokenmill's bfloat16 logits are close to the float32 reference: within
    `BF16_TOLERANCE` of its scale, or within `DTYPE_MARGIN` times transformers' own bfloat16
    distance from it. None: the backend's forward was not seen."""
    diff, scale = ours["logits_max_abs_diff"], ours["logits_scale"]
    if diff is None or scale is None:
        return None
    own = transformers["logits_max_abs_diff"] or 0.0
    return bool(diff <= max(BF16_TOLERANCE * scale, DTYPE_MARGIN * own))
