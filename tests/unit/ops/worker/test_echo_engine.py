"""ops.worker.echo_engine: the worker's `--engine echo` answers each request with its prompt's
tokens."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from actors.ingest.model_front import ModelFront
from gpu.engine import EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import CheckpointError, RequestRejected
from gpu.sequence import SamplingParams
from messages.error_codes import ErrorCode
from messages.request import GenerateRequest
from ops.models.offline import run_all
from ops.worker.echo_engine import EchoEngine, EchoModel, load_echo_model

CONFIG = EngineConfig(max_model_len=128, max_prompt_tokens=100, max_new_tokens=64, max_num_seqs=4)


@pytest.fixture(scope="module")
def model(tiny_checkpoints: dict[str, Path]) -> EchoModel:
    return load_echo_model(tiny_checkpoints["llama"], name="tiny")


@pytest.fixture
def engine(model: EchoModel) -> EchoEngine:
    return EchoEngine(model, CONFIG, clock=iter(range(1000)).__next__)


def _request(rid: str, prompt: list[int], max_new_tokens: int = 4) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingParams(max_new_tokens=max_new_tokens))


def test_a_request_gets_its_prompt_back_up_to_max_new_tokens(engine: EchoEngine) -> None:
    engine.add(_request("long", [5, 6, 7, 8, 9, 10], max_new_tokens=4))
    engine.add(_request("short", [11, 12], max_new_tokens=4))
    engine.add(_request("exact", [13, 14, 15], max_new_tokens=3))

    out = engine.step()

    done = {c.request_id: c for c in out.finished}
    assert [c.request_id for c in out.finished] == ["long", "short", "exact"]
    assert (done["long"].token_ids, done["long"].finish_reason) == ([5, 6, 7, 8], "length")
    assert (done["short"].token_ids, done["short"].finish_reason) == ([11, 12], "stop")
    assert (done["exact"].token_ids, done["exact"].finish_reason) == ([13, 14, 15], "length")
    assert done["long"].prompt_tokens == 6
    assert done["long"].text == engine.model.tokenizer.decode([5, 6, 7, 8])
    assert out.new_tokens[:4] == [("long", t) for t in (5, 6, 7, 8)]
    assert out.stats.num_seqs == 3
    assert out.stats.num_prefill_tokens == 11
    assert not engine.has_work()


def test_a_step_finishes_at_most_max_num_seqs_in_arrival_order(engine: EchoEngine) -> None:
    for i in range(6):
        engine.add(_request(f"r{i}", [i + 1]))

    first = engine.step()
    assert [c.request_id for c in first.finished] == ["r0", "r1", "r2", "r3"]
    assert first.stats.num_waiting == 2
    assert engine.has_work()
    second = engine.step()
    assert [c.request_id for c in second.finished] == ["r4", "r5"]
    assert not engine.has_work()


def test_run_all_drives_it_like_the_engine(engine: EchoEngine) -> None:
    requests = [_request(f"r{i}", [i + 1, i + 2, i + 3], max_new_tokens=2) for i in range(9)]

    run = run_all(engine, requests)  # type: ignore[arg-type]  # an Engine in all it uses

    assert [c.token_ids for c in run.completions] == [[i + 1, i + 2] for i in range(9)]
    assert len(run.steps) == 3


def test_abort_returns_an_empty_completion_once(engine: EchoEngine) -> None:
    engine.add(_request("a", [1, 2, 3]))

    aborted = engine.abort("a", "deadline")

    assert aborted is not None
    assert (aborted.token_ids, aborted.finish_reason, aborted.first_token_time) == (
        [],
        "deadline",
        None,
    )
    assert engine.abort("a") is None
    assert not engine.has_work()
    assert engine.step().finished == []


def test_timings_come_from_its_clock(engine: EchoEngine) -> None:
    engine.add(_request("a", [1, 2]))  # arrives at 0

    completion = engine.step().finished[0]  # finishes at 1

    assert (completion.arrival_time, completion.first_token_time, completion.finish_time) == (
        0,
        1,
        1,
    )
    assert completion.ttft_ms == 1000


@pytest.mark.parametrize(
    ("prompt", "max_new_tokens", "code"),
    [
        ([], 4, ErrorCode.EMPTY_PROMPT),
        ([1] * 101, 4, ErrorCode.PROMPT_TOO_LONG),
        ([1] * 10, 0, ErrorCode.INVALID_MAX_TOKENS),
        ([1] * 10, 65, ErrorCode.MAX_TOKENS_TOO_LARGE),
        ([1] * 100, 64, ErrorCode.MAX_TOKENS_TOO_LARGE),  # 164 > max_model_len 128
        ([1, 99999], 4, ErrorCode.TOKEN_OUT_OF_VOCABULARY),
        ([1, -1], 4, ErrorCode.TOKEN_OUT_OF_VOCABULARY),
    ],
)
def test_requests_past_the_limits_get_the_engines_error_codes(
    engine: EchoEngine, prompt: list[int], max_new_tokens: int, code: ErrorCode
) -> None:
    with pytest.raises(RequestRejected) as info:
        engine.add(_request("bad", prompt, max_new_tokens))
    assert info.value.code is code
    assert not engine.has_work()


def test_a_duplicate_id_is_refused(engine: EchoEngine) -> None:
    engine.add(_request("a", [1]))
    with pytest.raises(RequestRejected) as info:
        engine.add(_request("a", [2]))
    assert info.value.code is ErrorCode.DUPLICATE_REQUEST


def test_model_front_reads_it_like_the_engine(engine: EchoEngine, model: EchoModel) -> None:
    front = ModelFront.of_engine(engine)

    assert front.name == "tiny"
    assert front.digest == model.digest
    assert front.digest.startswith("echo:sha256:")
    assert (front.max_model_len, front.max_prompt_tokens, front.max_new_tokens) == (128, 100, 64)
    assert front.vocab_size == model.config.vocab_size
    ids = front.prompt_tokens(GenerateRequest(id="x", prompt="The quick brown fox"))
    assert ids == model.tokenizer.encode("The quick brown fox")
    assert front.ref.digest == model.digest


def test_it_needs_no_weight_files(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    # Config and tokenizer alone: were a weight file read, loading would fail here.
    folder = tmp_path / "no-weights"
    folder.mkdir()
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        shutil.copy(tiny_checkpoints["llama"] / name, folder / name)

    model = load_echo_model(folder)

    assert model.name == "no-weights"
    assert not hasattr(model, "module")
    assert model.digest == load_echo_model(tiny_checkpoints["llama"]).digest


def test_a_path_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError):
        load_echo_model(tmp_path / "missing")


@pytest.mark.slow
def test_smollm2_gguf_reads_only_the_header(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpu.loading.gguf_tensors

    def no_tensors(*_: object) -> None:
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(gpu.loading.gguf_tensors, "_checked_tensors", no_tensors)

    model = load_echo_model(smollm2_path, name="smollm2-135m")
    engine = EchoEngine(model)

    assert model.digest.startswith("echo:sha256:")
    assert model.config.arch == "llama"
    ids = model.tokenizer.encode("Hello, world")
    engine.add(_request("a", ids, max_new_tokens=len(ids)))
    assert engine.step().finished[0].text == "Hello, world"


def test_n_choices_each_echo_the_prompt(engine: EchoEngine) -> None:
    params = SamplingParams(max_new_tokens=2, n=3)
    [done] = run_all(engine, [EngineRequest("n", [5, 6, 7], params)]).completions
    assert done.token_ids == [5, 6] and [c.token_ids for c in done.choices] == [[5, 6]] * 3
