"""Swaps between a generative model and an embedding model: the swapper builds an encoder
engine for an embedding folder (`gpu.encoder`, faked here) and smoke-tests it with a vector;
after the flip the GPU actor answers embedding requests and refuses generation ones."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.ingest.model_front import EmbedInputs
from actors.mail import Outcome
from actors.swap.swapper import SwapError, smoke_ms
from gpu.encoder.spec import EmbeddingSpec
from messages.embedding import EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.events import ModelSwapped
from tests.unit.actors.fake_encoder import FakeEncoder
from tests.unit.actors.swap.test_swapper import Rig, batch, item
from tests.unit.actors.test_gpu_actor_embed import admitted


@pytest.fixture
def embedding_folder(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> Path:
    """A folder the (faked) encoder takes for an embedding model's; its config.json, which
    the swap's memory plan reads, a tiny Llama's."""
    folder = tmp_path / "embed"
    shutil.copytree(tiny_checkpoints["llama"], folder)
    (folder / "modules.json").write_text("[]")
    return folder


@pytest.fixture
def fake_encoder(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """`gpu.encoder`'s entry points, faked: a folder with modules.json embeds."""
    import gpu.encoder

    built: list[dict[str, Any]] = []

    def load(path: Path, **kw: Any) -> FakeEncoder:
        built.append({"path": path, **kw})
        return FakeEncoder(path=path, digest="sha256:" + "ef" * 32)

    def embeds(path: Path) -> bool:
        return (Path(path) / "modules.json").is_file()

    monkeypatch.setattr(gpu.encoder, "is_embedding_model", embeds, raising=False)
    monkeypatch.setattr(gpu.encoder, "load_encoder_engine", load, raising=False)
    return built


async def test_a_swap_to_an_embedding_model_serves_embeddings_after_the_flip(
    tiny_checkpoints: dict[str, Path], embedding_folder: Path, fake_encoder: list[dict[str, Any]]
) -> None:
    async with Rig(tiny_checkpoints["llama"]) as rig:
        swapped = await rig.swap(embedding_folder, "embed")
        assert isinstance(swapped, ModelSwapped), swapped
        assert swapped.to_model.task == "embed" and swapped.from_model.task == ""
        assert swapped.max_model_len == 16 and swapped.smoke_ms > 0
        (built,) = fake_encoder
        assert built["path"] == embedding_folder
        assert built["config"] is rig.gpu.slots.standby.config, "the active engine's settings"
        request = EmbedRequest(id="e", input=[[5, 6], [7]])
        embed = admitted(request, [5, 6, 7], EmbedInputs(([5, 6], [7])))
        embed.model_digest = swapped.to_model.digest
        await rig.gpu.send(batch(embed, item("late", rig.first)))
        outcomes = {o.result.id: o.result for o in await rig.outcomes.take(2, Outcome)}
        vectors = outcomes["e"]
        assert isinstance(vectors, EmbedResult) and vectors.ok and len(vectors.data) == 2
        refused = outcomes["late"]
        assert refused.error is not None and refused.error.code is ErrorCode.UNSUPPORTED_TASK
        back = await rig.swap(None, "rollback")
        assert isinstance(back, ModelSwapped) and back.to_model.digest == rig.first


def test_an_embedding_models_smoke_test_is_one_finite_vector() -> None:
    assert smoke_ms(FakeEncoder()) >= 0

    class Broken(FakeEncoder):
        def encode(self, inputs: Any, dimensions: int | None = None) -> list[np.ndarray]:
            return [np.full(8, np.nan, dtype=np.float32)]

    with pytest.raises(SwapError, match="no finite vector"):
        smoke_ms(Broken(EmbeddingSpec(dimensions=8, max_tokens=16)))
