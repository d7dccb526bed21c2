"""No new host sync in a step: the modules a step runs through are read, and every call that
blocks on or reads the device (`.tolist()`, `.item()`, `.cpu()`, `.numpy()`, `synchronize`),
makes a tensor from host values (`torch.tensor`, `torch.as_tensor`), pins memory, or makes a
generator must be one listed here, with the reason it is allowed. A step's inputs go through
`gpu.step_inputs` (one non-blocking copy); the only device read a step makes is the one that
returns the sampled token ids."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

HOT_PATH = (
    "gpu/backends/backend.py",
    "gpu/backends/step_batch.py",
    "gpu/backends/window_staging.py",
    "gpu/backends/decode_graphs.py",
    "gpu/backends/sdpa_attention.py",
    "gpu/backends/torch_ops.py",
    "gpu/backends/kernel_ops.py",
    "gpu/backends/native.py",
    "gpu/step_inputs.py",
    "gpu/kv_pool.py",
    "gpu/sampling.py",
    "gpu/penalties.py",
    "gpu/logprobs.py",
    "gpu/models/llama.py",
    "gpu/models/gemma.py",
    "gpu/models/gpt2.py",
    "gpu/models/moe.py",
    "gpu/models/layers.py",
    "gpu/grammar/mask.py",
    "gpu/kernels/step_kernels.py",
)
READS = {"tolist", "item", "cpu", "numpy", "synchronize", "pin_memory"}
MAKERS = {"tensor", "as_tensor", "Generator"}

# (module, enclosing function, call) -> why it may stay
ALLOWED = {
    (
        "gpu/backends/backend.py",
        "Backend.sample",
        "tolist",
    ): "the step's one read: the sampled tokens",
    ("gpu/logprobs.py", "read_sampled", "tolist"): "the step's one read, in place of the "
    "tokens' own on a step where a row asks for logprobs: tokens and logprobs together",
    ("gpu/logprobs.py", "read_step", "tolist"): "the step's one read, in place of the tokens' "
    "own on a step that scores prompt positions: tokens, logprobs and prompt logprobs together",
    ("gpu/sampling.py", "sample", "tolist"): "the wrapper for callers outside a step (the "
    "backend stages its rows and calls sample_tokens)",
    ("gpu/sampling.py", "SamplingRows.to_tensors", "tensor"): "for callers outside a step",
    ("gpu/penalties.py", "PenaltyRows.to_tensors", "tensor"): "for callers outside a step",
    ("gpu/step_inputs.py", "StepInputs._allocate", "numpy"): "a host tensor's numpy view",
    ("gpu/step_inputs.py", "StepInputs._allocate", "pin_memory"): "at start, and grown rarely",
    ("gpu/step_inputs.py", "StepInputs.begin", "synchronize"): "an event on the last copy",
    ("gpu/backends/decode_graphs.py", "DecodeGraphs.capture", "synchronize"): "at start, capturing",
    ("gpu/kv_pool.py", "KVPool.__init__", "tensor"): "once, at start",
    ("gpu/backends/sdpa_attention.py", "_prefill_spans", "tensor"): "the native CPU kernel's "
    "sequence bounds, in host memory (no CUDA library has `span_attention`)",
    ("gpu/kernels/step_kernels.py", "ChunkTables.check", "tolist"): "the native CPU kernel's "
    "block tables, host tensors checked before C reads them (no CUDA library takes them)",
    ("gpu/models/gemma.py", "embedding_scale", "tensor"): "cached per dtype, host scalar",
    ("gpu/models/layers.py", "longrope_tables", "tensor"): "at load",
    ("gpu/models/moe.py", "SparseMoE.forward", "tolist"): "expert row counts, one a MoE layer "
    "(so MoE models are not captured as CUDA graphs)",
    ("gpu/grammar/mask.py", "TokenMasks.build", "tensor"): "constrained rows only, pinned",
    ("gpu/grammar/mask.py", "TokenMasks.build", "pin_memory"): "constrained rows only",
    ("gpu/grammar/mask.py", "TokenMasks._buffer", "pin_memory"): "the mask buffer, grown rarely",
}


def _calls(path: str) -> set[tuple[str, str, str]]:
    """(module, qualified enclosing function, called name) of every listed kind of call."""
    tree = ast.parse((ROOT / path).read_text())
    found: set[tuple[str, str, str]] = set()

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*scope, child.name])
                continue
            name = None
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                attr, owner = child.func.attr, child.func.value
                if attr in READS or (
                    attr in MAKERS and isinstance(owner, ast.Name) and owner.id == "torch"
                ):
                    name = attr
            if isinstance(child, ast.keyword) and child.arg == "pin_memory":
                name = "pin_memory"
            if name is not None:
                found.add((path, ".".join(scope) or "<module>", name))
            visit(child, scope)

    visit(tree, [])
    return found


def test_no_step_module_reads_the_device_or_copies_from_the_host_unlisted() -> None:
    found = set().union(*(_calls(path) for path in HOT_PATH))
    unlisted = sorted(found - set(ALLOWED))
    assert not unlisted, f"host syncs or host→device copies in a step's modules: {unlisted}"


def test_every_listed_call_still_exists() -> None:
    found = set().union(*(_calls(path) for path in HOT_PATH))
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"listed but gone (drop them from ALLOWED): {stale}"
