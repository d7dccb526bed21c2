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
model keeps `nn.Linear` and nothing changes. The plain weight stays beside the packed copy
(a tied LM head still shares the embedding table; the native decode step reads it where a
weight has no panels), so on CPU the linear weights are held twice.

Where tokenmill's native kernels build, the second copy is not oneDNN's but panels
(`gpu/kernels/panel_linear.c`), and every product runs on them, whatever its rows: measured
2026-12-03 on SmolLM2-135M's 120 layer products, weights cold, 2 cores, best of 3 (ms):

| rows | 1 | 16 | 64 | 65 | 128 | 256 | 1024 |
|---|---|---|---|---|---|---|---|
| panels | 10.0 | 11.0 | 29.7 | 31.8 | 56.7 | 110.2 | 451.3 |
| oneDNN (rows padded to a bucket) | 11.6 | 15.6 | 37.8 | 42.5 | 67.1 | 117.9 | 461.1 |

Panels take exactly the rows asked (no zero rows, no per-shape primitives), and the native
decode step reads the same panels. oneDNN's packing stays for hosts without a C compiler.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu.kernels.native import CpuKernels

PANEL_ROWS = 64  # the most decode rows the native decode step takes over the panels


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
    """`y = x Wᵀ + b` with W held a second time in a CPU kernel's layout: in panels for
    tokenmill's native kernel (given `kernels`), else in oneDNN's opaque blocked layout.

    The plain weight stays, the same parameter (so a tied LM head still shares the embedding
    table): the native decode step (`gpu/backends/native_decode_step.py`) reads it where a weight
    has no panels.
    """

    packed: torch.Tensor | None  # [out, in] in oneDNN's blocked layout, without panels
    panels: torch.Tensor | None  # [ceil(out / width), in, width] (`CpuKernels.pack_panels`)

    def __init__(self, linear: nn.Linear, kernels: CpuKernels | None = None) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # [out, in]
        self.bias = linear.bias
        self.kernels = kernels
        weight = linear.weight.detach()
        panels = None if kernels is None else kernels.pack_panels(weight)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if panels is None else None
        self.register_buffer("panels", panels, persistent=False)
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.panels is not None:
            assert self.kernels is not None  # panels are packed by the kernels that read them
            flat = x.reshape(-1, self.in_features)  # [n, in]
            if flat.stride(1) != 1:
                flat = flat.contiguous()
            bias = None if self.bias is None else self.bias.detach()
            y = self.kernels.panel_linear(flat, self.panels, self.out_features, bias)
            return y.view(*x.shape[:-1], self.out_features)
        assert self.packed is not None
        rows = x.shape[0] if x.dim() == 2 else 0
        padded = bucket_rows(rows) if rows else 0
        if padded > rows:  # a shape oneDNN has a primitive for: zero rows below x's
            x = torch.cat((x, x.new_zeros(padded - rows, x.shape[1])))
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, "none", [], ""
        )
        return out[:rows] if padded > rows else out


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
    """Replace every `nn.Linear` in `module` by a `PackedLinear` (in panels, given `kernels`;
    else for oneDNN); return how many were."""
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
            for copy in (m.packed, m.panels):
                if copy is not None:
                    total += copy.numel() * copy.element_size()
    return total


def linear_kernel(module: nn.Module) -> str:
    """Which kernel `module`'s linears run on: native-panels, onednn-packed, or torch (not
    packed)."""
    for m in module.modules():
        if isinstance(m, PackedLinear):
            return "native-panels" if m.panels is not None else "onednn-packed"
    return "torch"
