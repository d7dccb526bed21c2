"""Counter-based noise: exact unsigned bits, row-independent, uniform, finite exponentials."""

from __future__ import annotations

import math

import pytest
import torch

from gpu.sampling_noise import (
    exponential_noise,
    neg_log,
    row_keys,
    uniform_bits,
    uniforms,
)

M32 = 0xFFFFFFFF


def reference_mix32(x: int) -> int:
    """lowbias32 on Python ints, where unsigned arithmetic is exact: what the int64 tensor
    ops must reproduce bit for bit on any device."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def reference_bits(seed: int, position: int, token: int) -> int:
    seed &= (1 << 64) - 1
    position &= (1 << 64) - 1
    words = (seed & M32, seed >> 32, position & M32, position >> 32)
    keys = []
    for start in (0x243F6A88, 0x85A308D3):
        h = reference_mix32(words[0] ^ start)
        for word in words[1:]:
            h = reference_mix32(h ^ word)
        keys.append(h)
    return reference_mix32(reference_mix32(token ^ keys[0]) ^ keys[1])


def noise_of(seeds: list[int], positions: list[int], vocab: int) -> torch.Tensor:
    return exponential_noise(torch.tensor(seeds), torch.tensor(positions), vocab)


@pytest.mark.parametrize(
    ("seed", "position"),
    [(0, 0), (1, 1), (2**63 - 1, 4095), (-1, 7), (123456789, 2**40 + 3), (-(2**63), 0)],
)
def test_bits_equal_exact_unsigned_arithmetic(seed: int, position: int) -> None:
    vocab = 64
    bits = uniform_bits(torch.tensor([seed]), torch.tensor([position]), vocab)[0]
    assert bits.tolist() == [reference_bits(seed, position, t) for t in range(vocab)]


def test_a_rows_noise_is_the_same_alone_and_anywhere_in_a_batch() -> None:
    vocab = 1000
    seeds = [11, 2**62 + 5, 0, 11, 99, 7, 2**63 - 1]
    positions = [0, 3, 3, 1, 4096, 17, 5]
    batch = noise_of(seeds, positions, vocab)  # [7, vocab]
    for row, (seed, position) in enumerate(zip(seeds, positions, strict=True)):
        alone = noise_of([seed], [position], vocab)[0]
        assert torch.equal(alone, batch[row])  # bit for bit
        after_others = noise_of([*seeds[:row], seed], [*positions[:row], position], vocab)
        assert torch.equal(after_others[-1], alone)


def test_keys_are_distinct_for_nearby_seed_position_pairs() -> None:
    bases = [0, 1 << 16, 1 << 32, (1 << 63) - 64]
    pairs = [(b + ds, p) for b in bases for ds in range(-32, 32) for p in range(256)]
    seeds = torch.tensor([s for s, _ in pairs])
    positions = torch.tensor([p for _, p in pairs])
    key_a, key_b = row_keys(seeds, positions)
    keys = set(zip(key_a.tolist(), key_b.tolist(), strict=True))
    assert len(keys) == len(pairs)


def test_different_positions_of_one_seed_draw_different_noise() -> None:
    positions = list(range(64))
    noise = noise_of([42] * 64, positions, 256)  # [64, 256]
    for i in range(64):
        for j in range(i + 1, 64):
            assert not torch.equal(noise[i], noise[j])


def test_uniforms_stay_strictly_inside_zero_and_one() -> None:
    rows, vocab = 256, 8192  # two million draws
    bits = uniform_bits(torch.arange(rows), torch.arange(rows) * 7, vocab)
    u = uniforms(bits)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    # The extremes of the 32-bit range, too.
    ends = uniforms(torch.tensor([0, M32]))
    assert ends.tolist() == [2.0**-33, 1 - 2.0**-33]
    e = neg_log(ends).float()
    assert bool(torch.isfinite(e).all()) and bool((e > 0).all())


def test_bits_are_uniform() -> None:
    rows, vocab = 512, 2048  # ~1M draws into 256 buckets, for the high and the low byte
    bits = uniform_bits(torch.arange(rows) * 3 + 1, torch.arange(rows), vocab).flatten()
    expected = bits.numel() / 256
    for byte in (bits >> 24, bits & 0xFF):
        counts = torch.bincount(byte, minlength=256).double()
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        # 255 degrees of freedom: mean 255, sd ~22.6; 400 is over six sd away.
        assert chi2 < 400, chi2


def test_neighbouring_tokens_and_positions_are_uncorrelated() -> None:
    rows, vocab = 256, 4096
    u = uniforms(uniform_bits(torch.full((rows,), 5), torch.arange(rows), vocab))
    centred = u - 0.5

    def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a * b).mean() / (a.std() * b.std()))

    # ~1M pairs: one standard error is about 0.001.
    assert abs(correlation(centred[:, 1:], centred[:, :-1])) < 0.006  # token t, t + 1
    assert abs(correlation(centred[1:], centred[:-1])) < 0.006  # position p, p + 1


def test_noise_is_exponential() -> None:
    e = noise_of(list(range(256)), [9] * 256, 4096).double()  # ~1M draws
    assert math.isclose(float(e.mean()), 1.0, abs_tol=0.005)
    assert math.isclose(float(e.var()), 1.0, abs_tol=0.01)
    # P(E > x) = exp(-x)
    for x in (0.1, 1.0, 3.0):
        assert math.isclose(float((e > x).double().mean()), math.exp(-x), rel_tol=0.03)


def test_neg_log_matches_the_logarithm() -> None:
    u = torch.cat(
        [
            torch.linspace(1e-6, 1 - 1e-6, 10001, dtype=torch.float64),
            torch.tensor([2.0**-33, 0.5, math.sqrt(0.5), 1 - 2.0**-33], dtype=torch.float64),
        ]
    )
    exact = -torch.log(u)
    assert bool(((neg_log(u) - exact).abs() <= 1e-12 + 1e-9 * exact).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_noise_is_bit_identical_on_cpu_and_cuda() -> None:
    seeds = torch.arange(64) * 2654435761
    positions = torch.arange(64) + 100
    cpu = exponential_noise(seeds, positions, 50_000)
    cuda = exponential_noise(seeds.cuda(), positions.cuda(), 50_000).cpu()
    assert torch.equal(cpu, cuda)
