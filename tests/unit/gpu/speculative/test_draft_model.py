"""`gpu.speculative.draft_model`: a draft model's greedy guesses, on its own KV pool, against
the engine's own greedy run of the same model; trimming rejected guesses, room, release, and
the tokenizer check."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import tokenizers
import torch

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import SpeculativeConfigError
from gpu.kv_pool import PAD_BLOCK
from gpu.loading.loader import LoadedModel, load_model
from gpu.loading.tokenizer import Tokenizer
from gpu.sequence import SamplingParams
from gpu.speculative.draft_model import DraftModelProposer, draft_pool_blocks, load_draft
from gpu.speculative.proposer import ProposalRequest
from ops.models.offline import run_all
from tests.tiny_models import LONGROPE_ORIGINAL

# Small blocks and budget: long prompts catch up over several forwards, span many blocks.
CHUNKY = EngineConfig(block_size=4, max_num_batched_tokens=48, num_kv_blocks=2048)
NEW = 16  # tokens of each reference continuation


def prompts(vocab: int, lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 1, (n,), generator=g).tolist() for n in lengths]


def greedy(model: LoadedModel, batch: list[list[int]], config: EngineConfig = CHUNKY) -> list:
    """The engine's greedy continuation of each prompt (NEW tokens, past EOS)."""
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    run = run_all(
        Engine(model, config), [EngineRequest(str(i), p, params) for i, p in enumerate(batch)]
    )
    return [c.token_ids for c in run.completions]


def ask(tokens: list[list[int]], k: int, prompt_lens: list[int] | None = None) -> list:
    lens = prompt_lens or [len(t) for t in tokens]
    return [
        ProposalRequest(str(i), t, n, k) for i, (t, n) in enumerate(zip(tokens, lens, strict=True))
    ]


@pytest.fixture(scope="module")
def llama(tiny_checkpoints: dict[str, Path]) -> LoadedModel:
    return load_model(tiny_checkpoints["llama"])


def proposer(draft: LoadedModel, target: LoadedModel, **kwargs: object) -> DraftModelProposer:
    config = kwargs.pop("config", CHUNKY)
    assert isinstance(config, EngineConfig)
    return DraftModelProposer(draft, target, config, 256, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2", "qwen3_moe"])
@pytest.mark.parametrize("native", [True, False], ids=["native-paged", "sdpa-gather"])
def test_the_target_drafting_for_itself_proposes_its_greedy_continuation(
    tiny_checkpoints: dict[str, Path], arch: str, native: bool
) -> None:
    model = load_model(tiny_checkpoints[arch])
    config = replace(CHUNKY, native_kernels=native)
    batch = prompts(model.config.vocab_size, (1, 5, 37, 70))  # 70: two catch-up forwards
    want = greedy(model, batch, config)
    draft = proposer(model, model, config=config)
    assert draft.propose(ask(batch, 5)) == [w[:5] for w in want]
    # The target took 2 of the 5 guesses and its own next token: the rest is trimmed.
    now = [p + w[:3] for p, w in zip(batch, want, strict=True)]
    assert draft.propose(ask(now, 6)) == [w[3:9] for w in want]


def test_rejected_guesses_are_trimmed_before_the_next_proposal(llama: LoadedModel) -> None:
    batch = prompts(llama.config.vocab_size, (3, 9, 30))  # 9 + guesses: a block boundary
    draft = proposer(llama, llama)
    first = draft.propose(ask(batch, 6))
    # The target disagreed with the first guess: its own token (another one) follows.
    other = [[(g[0] + 1) % llama.config.vocab_size] for g in first]
    now = [p + o for p, o in zip(batch, other, strict=True)]
    assert draft.propose(ask(now, 4)) == [w[:4] for w in greedy(llama, now)]
    # And a sequence the target rolled back further (say, one preempted and rebuilt).
    shorter = [p[: max(1, len(p) // 2)] for p in batch]
    assert draft.propose(ask(shorter, 3)) == [w[:3] for w in greedy(llama, shorter)]


def test_a_draft_of_another_model_proposes_that_models_continuation(
    tiny_checkpoints: dict[str, Path], llama: LoadedModel
) -> None:
    qwen2 = load_model(tiny_checkpoints["qwen2"])  # the same tokenizer, other weights
    batch = prompts(llama.config.vocab_size, (4, 20))
    assert proposer(qwen2, llama).propose(ask(batch, 4)) == [w[:4] for w in greedy(qwen2, batch)]


def test_long_rope_drafts_recompute_when_the_sequence_outgrows_the_original_length(
    tiny_checkpoints: dict[str, Path],
) -> None:
    phi3 = load_model(tiny_checkpoints["phi3"])
    (prompt,) = prompts(phi3.config.vocab_size, (LONGROPE_ORIGINAL - 8,))
    (want,) = greedy(phi3, [prompt])
    draft = proposer(phi3, phi3)
    assert draft.propose(ask([prompt], 4)) == [want[:4]]
    grown = prompt + want[:10]  # past the original length: rotated long from position 0
    assert draft.propose(ask([grown], 4, [len(prompt)])) == [want[10:14]]


def test_release_frees_every_block(llama: LoadedModel) -> None:
    batch = prompts(llama.config.vocab_size, (2, 17, 44))
    draft = proposer(llama, llama)
    draft.propose(ask(batch, 4))
    assert draft.blocks_used > 0
    for i in range(len(batch)):
        draft.release(str(i))
    draft.release("never-seen")  # nothing to free
    assert draft.blocks_used == 0
    assert draft.blocks.num_free == draft.num_blocks


def test_a_sequence_without_room_gets_no_guesses_and_holds_nothing(llama: LoadedModel) -> None:
    a, b, c = prompts(llama.config.vocab_size, (10, 30, 22))
    draft = proposer(llama, llama, num_blocks=10)  # 40 positions of 4 tokens a block
    # a takes 4 blocks (10 tokens and 3 guesses computed); b needs 9 of the 6 left.
    first = draft.propose(ask([a, b], 4))
    assert first[0] == greedy(llama, [a])[0][:4] and first[1] == []
    assert draft.blocks_used == 4
    # c (22 tokens) fits 24 positions beside a: 3 guesses, not 4.
    (want_c,) = greedy(llama, [c])
    assert draft.propose([ProposalRequest("c", c, len(c), 4)]) == [want_c[:3]]
    draft.release("c")
    draft.release("0")
    (want_b,) = greedy(llama, [b])
    assert draft.propose([ProposalRequest("1", b, len(b), 4)]) == [want_b[:4]]


def test_a_sequence_at_the_end_of_its_positions_gets_no_guesses(llama: LoadedModel) -> None:
    draft = DraftModelProposer(llama, llama, CHUNKY, 16)
    (long,) = prompts(llama.config.vocab_size, (draft.max_len + 1,))
    assert draft.propose([ProposalRequest("x", long, len(long), 4)]) == [[]]
    assert draft.blocks_used == 0


def test_a_draft_with_another_tokenizer_is_refused(llama: LoadedModel) -> None:
    vocab = {f"w{i}": i for i in range(llama.config.vocab_size)}
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    stranger = replace(llama, name="stranger", tokenizer=Tokenizer(inner))
    with pytest.raises(SpeculativeConfigError, match=r"'stranger'.*'llama'"):
        proposer(stranger, llama)
    bigger = replace(llama, name="bigger", config=replace(llama.config, vocab_size=10_000))
    with pytest.raises(SpeculativeConfigError, match=r"bigger.*10000"):
        proposer(bigger, llama)


def test_the_pool_takes_a_quarter_of_the_targets_bytes_at_most(llama: LoadedModel) -> None:
    config = replace(CHUNKY, num_kv_blocks=400, max_num_seqs=64)
    assert draft_pool_blocks(llama, llama, config, 256) == 100
    few = replace(config, max_num_seqs=1)  # one sequence of 256 + 16 guesses: 68 blocks
    assert draft_pool_blocks(llama, llama, few, 256) == 68


def test_the_targets_own_checkpoint_loads_int4(llama: LoadedModel) -> None:
    draft = load_draft(llama.path, llama, "none", name="self")
    assert draft.quantization.startswith("int4") and draft.name == "self"
    assert (draft.dtype, draft.device) == (llama.dtype, llama.device)
    (prompt,) = prompts(llama.config.vocab_size, (12,))
    (guesses,) = proposer(draft, llama).propose(ask([prompt], 4))
    assert len(guesses) == 4


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: sliding windows' tables too
@pytest.mark.parametrize("native", [True, False], ids=["native-paged", "sdpa-gather"])
def test_blocks_held_for_guesses_may_hold_anything_before_they_are_written(
    tiny_checkpoints: dict[str, Path], arch: str, native: bool
) -> None:
    """The pool is allocated, not zeroed: a block taken for guesses not yet computed holds
    whatever the memory held (NaN, say). A decode beside a longer one reads its table up to
    the group's width; it must read padding past its own blocks, never those (0 × NaN)."""
    model = load_model(tiny_checkpoints[arch])
    config = replace(CHUNKY, native_kernels=native)
    batch = prompts(model.config.vocab_size, (1, 5, 37, 70))
    want = greedy(model, batch, config)
    draft = proposer(model, model, config=config)
    draft.kv.cache.fill_(float("nan"))
    draft.kv.zero(torch.tensor([PAD_BLOCK]))
    assert draft.propose(ask(batch, 5)) == [w[:5] for w in want]
