"""`--speculative` and `--speculative-model` parsed, and every bad spelling refused by name."""

import pytest

from gpu.engine_config import EngineConfig
from gpu.errors import SpeculativeConfigError
from gpu.speculative.config import DEFAULT_K, SpeculativeConfig


def test_no_flag_means_no_speculation() -> None:
    assert SpeculativeConfig.parse(None) is None
    assert EngineConfig().speculation() is None


def test_ngram_defaults_and_options() -> None:
    plain = SpeculativeConfig.parse("ngram")
    assert plain == SpeculativeConfig("ngram", k=DEFAULT_K, ngram_min=1, ngram_max=3)
    tuned = SpeculativeConfig.parse("ngram:k=6,n=2-4")
    assert tuned == SpeculativeConfig("ngram", k=6, ngram_min=2, ngram_max=4)
    single = SpeculativeConfig.parse("ngram:n=2")
    assert single == SpeculativeConfig("ngram", ngram_min=2, ngram_max=2)
    assert SpeculativeConfig.parse("ngram", k=7) == SpeculativeConfig("ngram", k=7)
    assert tuned.describe() == "ngram:k=6,n=2-4"


def test_draft_model() -> None:
    spec = SpeculativeConfig.parse(None, "smollm2-135m", 5)
    assert spec == SpeculativeConfig("draft", k=5, model="smollm2-135m")
    config = EngineConfig(speculative_model="m")
    assert config.speculation() == SpeculativeConfig("draft", model="m")


@pytest.mark.parametrize(
    ("spec", "model", "k", "words"),
    [
        ("eagle", None, None, "unknown proposer"),
        ("ngram:k=0", None, None, "k must be"),
        ("ngram:k=17", None, None, "k must be"),
        ("ngram:k=x", None, None, "bad --speculative option"),
        ("ngram:n=3-1", None, None, "n must be"),
        ("ngram:n=0-2", None, None, "n must be"),
        ("ngram:m=2", None, None, "bad --speculative option"),
        ("ngram", "m", None, "exclude each other"),
        (None, None, 3, "needs --speculative-model"),
    ],
)
def test_bad_settings_are_refused_by_name(
    spec: str | None, model: str | None, k: int | None, words: str
) -> None:
    with pytest.raises(SpeculativeConfigError, match=words):
        SpeculativeConfig.parse(spec, model, k)


def test_engine_config_checks_at_construction() -> None:
    with pytest.raises(SpeculativeConfigError):
        EngineConfig(speculative="ngram:k=99")
    with pytest.raises(ValueError):  # a SpeculativeConfigError is a ValueError for the CLI
        EngineConfig(speculative="nope")
