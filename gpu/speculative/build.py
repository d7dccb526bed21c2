"""The engine's speculator, as its config asks: prompt lookup, a draft model, or none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu.engine_config import EngineConfig
from gpu.errors import SpeculativeConfigError
from gpu.speculative.prompt_lookup import PromptLookup
from gpu.speculative.proposer import Proposer
from gpu.speculative.speculator import SpeculationLimits, Speculator

if TYPE_CHECKING:
    from gpu.loading.loader import LoadedModel


def build_speculator(
    model: LoadedModel,
    config: EngineConfig,
    max_model_len: int,
    long_rope_original: int | None = None,
    draft: LoadedModel | None = None,
) -> Speculator | None:
    """None when the config asks for no speculation. `draft`: the loaded draft model, which
    `config.speculative_model` needs (`ops.models.engine_options` loads it)."""
    spec = config.speculation()
    if spec is None:
        if draft is not None:
            raise SpeculativeConfigError("a draft model was given but no speculative_model set")
        return None
    proposer: Proposer
    if spec.kind == "ngram":
        proposer = PromptLookup(spec)
    else:
        if draft is None:
            raise SpeculativeConfigError(
                f"speculative_model {spec.model!r} was set but no draft model was loaded"
            )
        from gpu.speculative.draft_model import DraftModelProposer

        proposer = DraftModelProposer(draft, model, config, max_model_len)
    return Speculator(proposer, spec, SpeculationLimits(max_model_len, long_rope_original))
