"""Packed linear layers (in panels for the native kernels, else oneDNN's layout): same
products as `nn.Linear`, swapped in at load on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.kernels.native import cpu_kernels
from gpu.loading.loader import load_model
from gpu.memory.footprint import engine_bytes
from gpu.models.packed_linear import (
    PANEL_ROWS,
    PackedLinear,
    bucket_rows,
    pack_linears,
    packing_available,
)

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu"), torch.float32), reason="PyTorch without oneDNN"
)


def layouts() -> list[str]:
    return ["onednn", "panels"] if cpu_kernels() is not None else ["onednn"]


def packed_as(layout: str, linear: nn.Linear) -> PackedLinear:
    packed = PackedLinear(linear, cpu_kernels() if layout == "panels" else None)
    assert (packed.panels is not None, packed.packed is not None) == (
        layout == "panels",
        layout == "onednn",
    )
    return packed


@pytest.mark.parametrize("layout", layouts())
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 64, 65, 300])
def test_packed_product_equals_linear(layout: str, bias: bool, rows: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias)
    packed = packed_as(layout, linear)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", layouts())
def test_packed_takes_any_leading_shape_and_strides(layout: str) -> None:
    linear = nn.Linear(32, 48)
    packed = packed_as(layout, linear)
    x = torch.randn(3, 5, 32)
    transposed = torch.randn(32, 6).t()  # [6, 32], not contiguous
    with torch.inference_mode():
        assert packed(x).shape == (3, 5, 48)
        torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(packed(transposed), linear(transposed), atol=1e-5, rtol=1e-5)


def test_panels_take_every_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the native kernels, every product runs on the panels, whatever its rows and
    shape: oneDNN is never reached (and holds nothing)."""
    kernels = cpu_kernels()
    if kernels is None:
        pytest.skip("no native kernels on this host")
    torch.manual_seed(0)
    linear = nn.Linear(96, 200)
    packed = PackedLinear(linear, kernels)
    assert packed.packed is None
    took: list[int] = []
    panel_linear = kernels.panel_linear

    def spy(x: torch.Tensor, *args: object) -> torch.Tensor:
        took.append(x.shape[0])
        return panel_linear(x, *args)  # type: ignore[arg-type]

    def no_onednn(*args: object) -> torch.Tensor:
        raise AssertionError("oneDNN reached")

    monkeypatch.setattr(kernels, "panel_linear", spy)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", no_onednn)
    with torch.inference_mode():
        for rows in (1, 9, PANEL_ROWS, PANEL_ROWS + 1, 300):
            x = torch.randn(rows, 96)
            torch.testing.assert_close(packed(x), linear(x), atol=1e-4, rtol=1e-5)
        assert packed(torch.randn(3, 5, 96)).shape == (3, 5, 200)
        transposed = torch.randn(96, 4).t()  # rows not contiguous
        torch.testing.assert_close(packed(transposed), linear(transposed), atol=1e-4, rtol=1e-5)
    assert took == [1, 9, PANEL_ROWS, PANEL_ROWS + 1, 300, 15, 4]


def test_pack_linears_replaces_every_linear_and_keeps_the_rest() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    embedding = nn.Embedding(10, 8)
    head = nn.Linear(8, 10, bias=False)
    head.weight = embedding.weight  # tied, as a tied LM head is
    model.append(head)
    assert pack_linears(model) == 3
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model[1], nn.ReLU)
    # The head still shares the embedding's table (the plain weight stays beside the packed).
    assert model[3].weight is embedding.weight
    with torch.inference_mode():
        x = torch.randn(2, 8)
        torch.testing.assert_close(model[3](x), x @ embedding.weight.t(), atol=1e-5, rtol=1e-5)


def test_load_model_packs_on_cpu_unless_told_not_to(tiny_checkpoints: dict[str, Path]) -> None:
    packed = load_model(tiny_checkpoints["llama"], device="cpu")
    plain = load_model(tiny_checkpoints["llama"], device="cpu", pack=False)
    assert packed.linear_kernel == ("onednn-packed" if cpu_kernels() is None else "native-panels")
    assert plain.linear_kernel == "torch"
    assert any(isinstance(m, PackedLinear) for m in packed.module.modules())
    assert not any(isinstance(m, PackedLinear) for m in plain.module.modules())


def test_footprint_counts_packed_weights(tiny_checkpoints: dict[str, Path]) -> None:
    config = EngineConfig(num_kv_blocks=64)
    kernels = cpu_kernels()
    for arch in ("llama", "gpt2"):
        packed = Engine(load_model(tiny_checkpoints[arch], device="cpu"), config)
        plain = Engine(load_model(tiny_checkpoints[arch], device="cpu", pack=False), config)
        # Packing holds every linear weight a second time: in panels where the native kernels
        # build (the last panel of each filled out), else in oneDNN's layout.
        linears = [m for m in plain.model.module.modules() if isinstance(m, nn.Linear)]
        extra = sum(m.weight.numel() * 4 for m in linears)
        if kernels is not None:
            width = kernels.panel_width
            extra = sum(-(-m.out_features // width) * width * m.in_features * 4 for m in linears)
        assert packed.model.packed_bytes == extra
        assert engine_bytes(packed) == engine_bytes(plain) + extra


def test_row_buckets_are_few_and_waste_little() -> None:
    buckets = [bucket_rows(n) for n in range(1, 1025)]
    assert all(b >= n for n, b in zip(range(1, 1025), buckets, strict=True))
    assert buckets == sorted(buckets)
    assert len(set(buckets)) == 37  # every step of a run up to the default token budget
    assert all(b - n <= 7 for n, b in zip(range(1, 129), buckets, strict=False))
    assert all(b - n <= 63 for n, b in zip(range(1, 1025), buckets, strict=True))
    assert bucket_rows(1025) == 1280


def test_varied_steps_reach_onednn_in_few_shapes(
    tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN caches a primitive per input shape: a run of many batch sizes and lengths must
    reach it in a bounded set of shapes, or its cache (and the worker's memory) grows."""
    from gpu.engine import EngineRequest
    from gpu.sequence import SamplingParams
    from ops.models.offline import run_all

    shapes: set[tuple[int, ...]] = set()
    product = torch.ops.mkldnn._linear_pointwise

    def spy(x: torch.Tensor, *args: object) -> torch.Tensor:
        shapes.add(tuple(x.shape))
        return product(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    monkeypatch.setattr("gpu.loading.loader.cpu_kernels", lambda: None)  # oneDNN's layout
    engine = Engine(load_model(tiny_checkpoints["llama"], device="cpu"), EngineConfig())
    g = torch.Generator().manual_seed(1)
    for wave in range(12):
        count = int(torch.randint(1, 40, (1,), generator=g))
        lengths = torch.randint(1, 200, (count,), generator=g).tolist()
        requests = [
            EngineRequest(f"{wave}-{i}", list(range(1, n + 1)), SamplingParams(max_new_tokens=4))
            for i, n in enumerate(lengths)
        ]
        run_all(engine, requests)
    rows = {shape[0] for shape in shapes}
    assert len(rows) >= 5, "the spy saw the products"
    assert rows <= {bucket_rows(n) for n in range(1, 1025)}
    assert len(rows) <= 37
