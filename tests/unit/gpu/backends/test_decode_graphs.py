"""The static decode path (`gpu.backends.decode_graphs`): padded to a few batch sizes, through
buffers whose addresses never change. On CUDA it runs as captured graphs; here it runs eagerly, and
must give the dynamic path's tokens bit for bit, for every architecture, greedy and seeded,
with padded rows that never change real ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpu.backends.decode_graphs import DecodeLayout, graph_sizes
from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.sequence import SamplingParams
from ops.models.offline import run_all
from tests.tiny_models import ARCHS
from tests.unit.gpu.test_engine import CHUNKY, random_prompts

STATIC = replace(CHUNKY, decode_graphs="eager", max_num_seqs=12)
DYNAMIC = replace(STATIC, decode_graphs="off")


def test_sizes_cover_every_batch_up_to_the_engine_limit() -> None:
    assert graph_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 48, 64)
    assert graph_sizes(12) == (1, 2, 4, 8, 12)
    assert graph_sizes(200) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 200)
    assert graph_sizes(1) == (1,)


def test_layout_views_tile_the_buffer() -> None:
    layout = DecodeLayout(size=4, width=3, window=True, long_rope=False)
    buffer = torch.arange(layout.words)
    views = layout.views(buffer)
    assert list(views) == ["ids", "positions", "slots", "lengths", "starts", "tables"]
    assert views["tables"].shape == (4, 3)
    assert views["tables"].flatten()[-1].item() == layout.words - 1
    assert views["starts"].tolist() == [16, 17, 18, 19]


def test_the_engine_takes_the_static_path_only_when_asked_on_a_cpu(
    tiny_checkpoints: dict[str, Path],
) -> None:
    model = load_model(tiny_checkpoints["llama"])
    assert Engine(model, CHUNKY).backend.graphs is None  # auto: CPU steps stay dynamic
    assert Engine(model, STATIC).backend.graphs is not None
    assert (
        Engine(model, replace(STATIC, native_kernels=False)).backend.graphs is None
    )  # needs kernels
    with pytest.raises(ValueError, match="decode_graphs"):
        EngineConfig(decode_graphs="always")


def _tokens(model: LoadedModel, config: EngineConfig, params: list[SamplingParams]) -> list:
    prompts = random_prompts(model.config.vocab_size, len(params), seed=11, high=40)
    requests = [EngineRequest(str(i), p, params[i]) for i, p in enumerate(prompts)]
    engine = Engine(model, config)
    taken = 0
    step = engine.backend.graphs
    if step is not None:  # count the steps that went through the static path
        original = step.run

        def counted(size: int, staged: torch.Tensor) -> torch.Tensor:
            nonlocal taken
            taken += 1
            return original(size, staged)

        step.run = counted  # type: ignore[method-assign]
    result = run_all(engine, requests)
    return [[c.token_ids for c in result.completions], taken]


# 7 requests, different lengths and budgets: batches of 7 down to 1 pad to 8, 4, 2, 1.
PARAMS = [
    SamplingParams(max_new_tokens=4 + 3 * i, ignore_eos=True)
    if i % 2
    else SamplingParams(
        max_new_tokens=5 + 2 * i, temperature=0.8, top_p=0.9, seed=i, ignore_eos=True
    )
    for i in range(7)
]


@pytest.mark.parametrize("arch", ARCHS)
def test_static_decodes_give_the_dynamic_path_tokens(
    tiny_checkpoints: dict[str, Path], arch: str
) -> None:
    model = load_model(tiny_checkpoints[arch])
    dynamic, none_taken = _tokens(model, DYNAMIC, PARAMS)
    static, taken = _tokens(model, STATIC, PARAMS)
    assert none_taken == 0
    assert taken > 0
    assert static == dynamic


def test_padded_rows_never_change_real_rows(tiny_checkpoints: dict[str, Path]) -> None:
    """One sequence decoding at each padded size, its padding rows inert or holding other
    tokens at other positions: its row's logits are the same bits either way, and (sizes
    differ in the order of sums, not in what they sum) within float32 rounding across sizes."""
    model = load_model(tiny_checkpoints["llama"])
    engine = Engine(model, STATIC)
    prompt = random_prompts(model.config.vocab_size, 1, seed=2, high=30)[0]
    engine.add(EngineRequest("x", prompt, SamplingParams(max_new_tokens=8, ignore_eos=True)))
    while not any(seq.output_token_ids for seq in engine.sequences.values()):
        engine.step()  # the prompt, until the first token
    graphs = engine.backend.graphs
    assert graphs is not None
    chunks = list(engine.scheduler.schedule().chunks)
    assert len(chunks) == 1 and chunks[0].is_decode
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for size in graphs.sizes:
            staged = graphs.stage(engine.backend.builder, chunks, size).clone()
            inert = graphs.run(size, staged)[0].clone()
            busy = staged.clone()
            fields = graphs.layout(size).views(busy)
            fields["ids"][1:] = torch.randint(0, model.config.vocab_size, (size - 1,), generator=g)
            fields["positions"][1:] = torch.randint(0, 30, (size - 1,), generator=g)
            assert torch.equal(graphs.run(size, busy)[0], inert), f"size {size}"
            rows.append(inert)
    for row in rows[1:]:
        torch.testing.assert_close(row, rows[0], atol=1e-5, rtol=1e-5)


def test_the_cli_offers_the_engine_modes() -> None:
    from gpu.engine_config import DECODE_GRAPH_MODES
    from ops.models import engine_options

    assert engine_options.DECODE_GRAPH_MODES == DECODE_GRAPH_MODES
