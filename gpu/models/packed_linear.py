"""Linear layers whose weights oneDNN reorders once, at load, for the CPU it runs on.

On x86 CPUs `F.linear` goes to MKL, which picks its kernels by CPU vendor: on this project's
AMD machines it runs well below the cores' vector width. oneDNN picks kernels by instruction
set (AVX2, AVX-512) and, given a weight reordered into its blocked layout once, multiplies
2–3.5× faster at every row count a step has (measured 2026-12-01, SmolLM2-135M shapes, 2 cores:
the 49152 × 576 LM head at 1 row 6.9 → 3.0 ms, at 48 rows 23.1 → 6.9 ms; gate/up at 48 rows
1.24 → 0.38 ms). Results agree with `F.linear` to float32 rounding (a different summation
order), which the engine's parity tests against transformers cover.

`pack_linears` swaps every `nn.Linear` of a loaded model for a `PackedLinear`, on float32 CPU
models where PyTorch has oneDNN; elsewhere (GPUs, other dtypes, builds without oneDNN) the
model keeps `nn.Linear` and nothing changes. A packed weight is opaque memory (no storage a
tensor view could share) and the plain weight stays beside it for the one-token step.

Where tokenmill's native kernels build, the weight is also held in panels for products of
at most `PANEL_ROWS` rows, a decode step's (`gpu/kernels/panel_linear.c`): there they run
1.1–1.25× faster than oneDNN's with the 30 layers' weights cold, as in a real step
(measured 2026-12-02, SmolLM2-135M shapes, 2 cores, 1–64 rows; the same speed hot), and at
exactly the rows asked, with no zero rows. So on CPU the linear weights are held three times:
plain, oneDNN's, panels (SmolLM2: 0.54 GB each, all counted in `packed_bytes`).
"""

from __future__ import annotations

import torch
from torch import nn

from gpu.kernels.native import CpuKernels

PANEL_ROWS = 64  # the most rows a product runs on the panels (measured: 1–64 win; beyond, even)


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `pack_linears` would pack a model of this dtype on this device."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Module):
    """`y = x Wᵀ + b` with W held in oneDNN's reordered layout, and as it was.

    The plain weight stays, the same parameter (so a tied LM head still shares the embedding
    table): the native decode step (`gpu/models/llama_decode_step.py`) streams it.
    """

    packed: torch.Tensor  # [out, in] in oneDNN's opaque blocked layout
    panels: torch.Tensor | None  # [ceil(out / width), in, width] (`CpuKernels.pack_panels`)

    def __init__(self, linear: nn.Linear, kernels: CpuKernels | None = None) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # [out, in]
        self.register_buffer(
            "packed",
            torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),
            persistent=False,
        )
        self.bias = linear.bias
        self.kernels = kernels
        panels = None if kernels is None else kernels.pack_panels(linear.weight.detach())
        self.register_buffer("panels", panels, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.shape[0] if x.dim() == 2 else 0
        if self.panels is not None and 0 < rows <= PANEL_ROWS and x.stride(1) == 1:
            assert self.kernels is not None  # panels are packed by the kernels that read them
            bias = None if self.bias is None else self.bias.detach()
            return self.kernels.panel_linear(x, self.panels, self.out_features, bias)
        padded = bucket_rows(rows) if rows else 0
        if padded > rows:  # a shape oneDNN has a primitive for: zero rows below x's
            x = torch.cat((x, x.new_zeros(padded - rows, x.shape[1])))
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, "none", [], ""
        )
        return out[:rows] if padded > rows else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def bucket_rows(rows: int) -> int:
    """The row count a product of `rows` rows runs at: exact up to 8, then rounded up to a
    multiple of 8 (to 128), of 64 (to 1024), of 256 beyond.

    oneDNN builds (and caches, up to 1024) a primitive per input shape; a step's row count is
    anything from 1 to the token budget, so unbucketed the cache would grow with every new
    count and churn past its capacity (measured: a worker's RSS grew 94 MiB over 5,000 small
    requests). Bucketed, a run needs at most 37 shapes per weight up to the default token
    budget of 1024; the zero rows are at most 7 up to 128 rows (where a product is mostly
    streaming its weights), 63 up to 1024, 255 beyond."""
    for limit, step in ((8, 1), (128, 8), (1024, 64)):
        if rows <= limit:
            return -(-rows // step) * step
    return -(-rows // 256) * 256


def pack_linears(module: nn.Module, kernels: CpuKernels | None = None) -> int:
    """Replace every `nn.Linear` in `module` by a `PackedLinear` (with panels too, given
    `kernels`); return how many were."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child, kernels))
                count += 1
    return count


def packed_bytes(module: nn.Module) -> int:
    """Bytes the packed copies of `module`'s linear weights hold (0 when nothing is packed)."""
    total = 0
    for m in module.modules():
        if isinstance(m, PackedLinear):
            total += m.packed.numel() * m.packed.element_size()
            if m.panels is not None:
                total += m.panels.numel() * m.panels.element_size()
    return total
