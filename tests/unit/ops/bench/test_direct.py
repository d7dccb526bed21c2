"""`bench pipeline`'s direct engine (`ops/bench/direct.py`): what it hands the worker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from ops.bench.direct import with_kv_pool_of
from ops.models.engine_options import EngineChoice


def test_the_worker_gets_the_direct_engines_kv_pool_size() -> None:
    planned = EngineChoice(
        model="m", dtype=None, device=None, engine=EngineConfig(max_num_seqs=8)
    )  # num_kv_blocks None: each engine would plan its own pool
    engine = cast(Engine, SimpleNamespace(num_blocks=321))

    choice = with_kv_pool_of(planned, engine)

    assert choice.engine.num_kv_blocks == 321
    assert choice.engine.max_num_seqs == 8 and choice.model == "m"  # the rest as given
