"""The native linear kernels on weights held quantized (gpu/kernels/quant_gemv.c,
quant_linear.c): `CpuKernels.qlinear` against x · dequantize()ᵀ, and the one-call decode step
of a model whose linears are held quantized against its layers, on every vector path.

Tolerance: the reference is x · dequantize()ᵀ in float64; the kernels sum `in` float32
products in their own order (and dequantize with one FMA where the reference rounds twice),
so they are off by float32 rounding of the running sums: about 2^-24 · √in · (the sums'
size), where a sum is at most in · max|x| · max|w| but grows like √in · max|x| · max|w| for
these random signs. The atol is ATOL_UNIT · √in · max|x| · max|w| with ATOL_UNIT = 2^-20,
16× that rounding unit. On these cases PyTorch's own float32 product reaches 0.27 of it and
the kernels 0.37 (every build; each sum is one thread's, so the order, and the error, do not
depend on the thread count).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu.kernels.native import CpuKernels
from gpu.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from tests.unit.gpu.kernels import test_native

kernels = test_native.kernels  # the fixture: these kernels on every build
ATOL_UNIT = 2.0**-20
ROWS = (1, 2, 3, 5, 17, 64, 130)  # decode, the streaming kernels' edge, tiles and their tails


def random_weight(
    bits: int, out: int, inputs: int, group: int, offsets: bool, seed: int
) -> QuantizedWeight:
    """Every integer of the format, scales over two decades, offsets of either sign."""
    g = torch.Generator().manual_seed(seed)
    if bits == 8:
        data = torch.randint(-128, 128, (out, inputs), generator=g, dtype=torch.int8)
    else:
        data = torch.randint(0, 256, (out, inputs // 2), generator=g, dtype=torch.uint8)
    groups = (out, inputs // group)
    scales = torch.rand(groups, generator=g) * 0.1 + 1e-3
    shift = torch.randn(groups, generator=g) * 0.2 if offsets else None
    return QuantizedWeight(bits, group, data, scales, shift)


def reference(
    x: torch.Tensor, weight: QuantizedWeight | torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    w = weight if isinstance(weight, torch.Tensor) else weight.dequantize()
    return F.linear(x.double(), w.double(), None if bias is None else bias.double()).float()


def assert_close_dot(
    y: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, w: torch.Tensor
) -> None:
    atol = ATOL_UNIT * x.shape[1] ** 0.5 * float(x.abs().max()) * float(w.abs().max())
    torch.testing.assert_close(y, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    ("inputs", "group"),
    [(384, 16), (384, 32), (384, 128), (384, 384), (80, 16), (80, 80)],  # 80: 16 · odd inputs
)
@pytest.mark.parametrize("offsets", [True, False])
@pytest.mark.parametrize("out", [37, 100])
def test_qlinear_equals_the_dequantized_product(
    kernels: CpuKernels, bits: int, inputs: int, group: int, offsets: bool, out: int
) -> None:
    weight = random_weight(bits, out, inputs, group, offsets, seed=bits * out + group)
    bias = torch.randn(out)
    g = torch.Generator().manual_seed(inputs)
    dense = weight.dequantize()
    for m in ROWS:
        x = torch.randn(m, inputs, generator=g) * 2
        expected = reference(x, weight, bias if m % 2 else None)
        y = kernels.qlinear(x, weight, bias if m % 2 else None)
        assert_close_dot(y, expected, x, dense)


@pytest.mark.parametrize("m", ROWS)
def test_qlinear_of_float_weights_and_of_strided_rows(kernels: CpuKernels, m: int) -> None:
    """bits 32 (a plain float32 matrix) through the same paths; x a view of wider rows."""
    g = torch.Generator().manual_seed(m)
    wide = torch.randn(m, 160, generator=g)
    x = wide[:, 16:144]  # [m, 128], rows 160 apart
    for weight in (torch.randn(45, 128, generator=g), quantize_int4(torch.randn(45, 128), 32)):
        dense = weight if isinstance(weight, torch.Tensor) else weight.dequantize()
        y = kernels.qlinear(x, weight)
        assert_close_dot(y, reference(x, weight, None), x, dense)


def test_qlinear_of_what_the_quantizers_make(kernels: CpuKernels) -> None:
    w = torch.randn(300, 640)
    x = torch.randn(7, 640)
    for weight in (
        quantize_int8(w),
        quantize_int8(w, 32),
        quantize_int4(w, 32),
        quantize_int4(w, 128),
    ):
        assert_close_dot(kernels.qlinear(x, weight), reference(x, weight, None), x, w)


def test_qlinear_refuses_what_it_cannot_read(kernels: CpuKernels) -> None:
    weight = random_weight(4, 8, 64, 32, True, seed=0)
    with pytest.raises(ValueError, match="float32"):
        kernels.qlinear(torch.zeros(2, 64, dtype=torch.float64), weight)
    with pytest.raises(ValueError, match="features"):
        kernels.qlinear(torch.zeros(2, 48), weight)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.qlinear(torch.zeros(64, 2).T, weight)
    odd = QuantizedWeight(8, 24, torch.zeros(8, 24, dtype=torch.int8), torch.ones(8, 1), None)
    with pytest.raises(ValueError, match="multiples of 16"):
        kernels.qlinear(torch.zeros(2, 24), odd)
    with pytest.raises(ValueError, match="bias"):
        kernels.qlinear(torch.zeros(2, 64), weight, torch.zeros(9))


class HeldQuantized(nn.Module):
    """A stand-in for gpu.quant.linear.QuantizedLinear: `.qweight`, `.bias`, the features;
    its forward is the reference, the dequantized matrix through F.linear."""

    def __init__(self, qweight: QuantizedWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.qweight = qweight
        self.bias = bias
        self.out_features, self.in_features = qweight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.qweight.dequantize(), self.bias)


# Each linear in another format, so every kernel and the gate/up split of each is exercised.
FORMATS = {
    "qkv_proj": lambda w: quantize_int4(w, 16),
    "o_proj": lambda w: quantize_int8(w),
    "gate_up_proj": lambda w: quantize_int4(w, 32),
    "down_proj": lambda w: quantize_int8(w, 32),
    "lm_head": lambda w: quantize_int4(w, 64),
}
# GPT-2's products by their own names, in the same formats
FORMATS |= {
    "c_attn": FORMATS["qkv_proj"],
    "attn_proj": FORMATS["o_proj"],
    "c_fc": FORMATS["gate_up_proj"],
    "mlp_proj": FORMATS["down_proj"],
}
GPT2_NAMES = {"c_attn", "attn_proj", "c_fc", "mlp_proj"}
LLAMA_NAMES = set(FORMATS) - GPT2_NAMES


def hold_quantized(module: nn.Module, names: set[str]) -> int:
    """Swap the model's linears named in `names` for quantized stand-ins (FORMATS)."""
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            weight = getattr(child, "weight", None)
            if name in names and isinstance(weight, torch.Tensor):
                bias: torch.Tensor | None = getattr(child, "bias", None)
                setattr(parent, name, HeldQuantized(FORMATS[name](weight.detach()), bias))
                swapped += 1
    return swapped


MOE_NAMES = {"qkv_proj", "o_proj", "lm_head"}


@pytest.mark.parametrize(
    ("arch", "names", "experts"),
    [
        ("llama", LLAMA_NAMES, None),
        ("llama_scaled", LLAMA_NAMES, None),  # q/k/v and o biases
        ("llama_tied", LLAMA_NAMES - {"lm_head"}, None),  # the head float, the rest quantized
        ("qwen3", LLAMA_NAMES, None),  # q/k norms over each head, before the rotation
        # sandwich norms, GeGLU, sliding windows shorter than the prompts, soft caps (Gemma 2),
        # q/k norms and the sliding layers' own rotary tables (Gemma 3)
        ("gemma2", LLAMA_NAMES - {"lm_head"}, None),
        ("gemma3", LLAMA_NAMES - {"lm_head"}, None),
        # LayerNorms with biases, biases on every product, GELU not gated, learned positions
        ("gpt2", GPT2_NAMES, None),
        # top-2 routers over SwiGLU experts (renormalised, and not: Qwen3-MoE's q/k norms too),
        # the attention and the head quantized; the experts float32, int4 or int8
        ("mixtral", MOE_NAMES, None),
        ("mixtral", MOE_NAMES, "int4"),
        ("qwen3_moe", MOE_NAMES, None),
        ("qwen3_moe", MOE_NAMES, "int8"),
    ],
)
def test_one_call_decode_step_with_quantized_linears_matches_the_layers(
    kernels: CpuKernels,
    tiny_checkpoints: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    arch: str,
    names: set[str],
    experts: str | None,
) -> None:
    """One and two decode tokens: the native step's logits against the layers' path run on
    the same quantized weights (dequantized, through F.linear; quantized experts through
    `QuantizedLinear`)."""
    import gpu.backends.choose
    from gpu.engine import Engine
    from gpu.loading.loader import load_model
    from gpu.scheduler import ScheduledChunk
    from gpu.sequence import SamplingParams, Sequence
    from tests.unit.gpu.test_engine import CHUNKY, LOGITS_ATOL, random_prompts

    monkeypatch.setattr(gpu.backends.choose, "cpu_kernels", lambda: kernels)
    model = load_model(tiny_checkpoints[arch], device="cpu")
    per_layer = len(names - {"lm_head"})
    assert hold_quantized(model.module, names) == per_layer * model.config.num_layers + (
        "lm_head" in names
    )
    if experts is not None:
        from gpu.quant.apply import quantize_linears
        from gpu.quant.scheme import Quantization

        done = quantize_linears(model.module, Quantization.parse(experts))
        assert len(done) == 2 * model.config.num_layers  # each sparse layer's two products
    engine = Engine(model, CHUNKY)
    prompts = random_prompts(model.config.vocab_size, 2, seed=7, low=20, high=90)
    seqs = [Sequence(str(i), p, SamplingParams(), arrival_time=0.0) for i, p in enumerate(prompts)]
    with torch.inference_mode():
        for seq in seqs:  # the context, through the layers
            n = seq.num_tokens
            engine.scheduler.kv_cache.allocate(seq, n)
            engine.backend.run_model(engine.backend.build([ScheduledChunk.of(seq, 0, n - 1)]))
        for count in (1, 2):
            chunks = [ScheduledChunk.of(seq, seq.num_tokens - 1, 1) for seq in seqs[:count]]
            inputs = engine.backend.build(chunks)
            native = engine.backend.forward(inputs)
            assert engine.backend.decode_step is not None  # type: ignore[attr-defined]
            layered = engine.backend.run_model(inputs)  # the model's layers
            torch.testing.assert_close(native, layered, atol=LOGITS_ATOL, rtol=0)
