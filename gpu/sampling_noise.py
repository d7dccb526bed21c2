"""Counter-based Exp(1) noise for the sampler: a pure function of (seed, position, token).

No generator state: row r's noise for token t is a hash of (seeds[r], positions[r], t), so a
row's draws do not depend on what else shares the batch, a recomputed position draws again
exactly what it drew before, and the whole computation is a fixed sequence of elementwise
tensor ops whose shapes depend only on [rows, vocab] (a CUDA graph can hold it).

The hash. Each 32-bit word lives in an int64 tensor, so right shifts are logical (the values
are never negative) and nothing relies on unsigned types. The mixer is the "lowbias32"
xorshift-multiply finaliser (shifts 16, 15, 16; odd multipliers 0x7FEB352D, 0x846CA68B).
A product `x * c mod 2^32` is formed as `x * (c - 2^32)` when c ≥ 2^31, so |x * c| < 2^63
and int64 never overflows; masking with 2^32 - 1 then gives the same bits as unsigned
arithmetic would. Per row, the 64-bit seed and 64-bit position are absorbed one 32-bit word
at a time (`h = mix(h ^ word)`) into two keys with different starting values; per token,
`mix(mix(t ^ key_a) ^ key_b)`. Every step is a bijection of the word just absorbed, so two
positions of one seed always get different keys.

Uniform to exponential. The 32 hash bits give U = (2h + 1) / 2^33: exactly representable in
float64 and strictly inside (0, 1). E = -ln(U) is computed from frexp and an atanh series
using only +, -, * and / (IEEE-rounded alike on every device and in every code path),
not `torch.log`, whose vectorized and scalar CPU paths (and CUDA's libm) may differ in
the last bit; so the noise is bit-identical on CPU and CUDA and wherever a row sits.
"""

from __future__ import annotations

import math

import torch

_M32 = 0xFFFFFFFF
_KEY_A = 0x243F6A88  # starting values for the two row keys: digits of pi, nothing special
_KEY_B = 0x85A308D3
_SQRT_HALF = math.sqrt(0.5)
_LN2 = math.log(2.0)
# ln m = 2 atanh(s) = 2s (1 + s²/3 + s⁴/5 + ...), s = (m - 1) / (m + 1); with m in [√½, √2),
# s² < 0.0295, so terms through s¹⁰ leave a relative error under 1e-9.
_ATANH_SERIES = (1 / 11, 1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:  # x: int64 in [0, 2^32)
    c = c - (1 << 32) if c >= 1 << 31 else c  # same product mod 2^32, no int64 overflow
    return (x * c) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:  # int64 in [0, 2^32) → the same range
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(
    seeds: torch.Tensor,  # [rows] int64
    positions: torch.Tensor,  # [rows] int64
) -> tuple[torch.Tensor, torch.Tensor]:  # two [rows] int64 keys in [0, 2^32)
    words = (seeds & _M32, (seeds >> 32) & _M32, positions & _M32, (positions >> 32) & _M32)
    keys = []
    for start in (_KEY_A, _KEY_B):
        h = _mix32(words[0] ^ start)
        for word in words[1:]:
            h = _mix32(h ^ word)
        keys.append(h)
    return keys[0], keys[1]


def uniform_bits(
    seeds: torch.Tensor,  # [rows] int64
    positions: torch.Tensor,  # [rows] int64
    vocab: int,
) -> torch.Tensor:  # [rows, vocab] int64 in [0, 2^32)
    key_a, key_b = row_keys(seeds, positions)
    tokens = torch.arange(vocab, device=seeds.device).unsqueeze(0)  # [1, vocab]
    h = _mix32(tokens ^ key_a.unsqueeze(1))  # [rows, vocab]
    return _mix32(h ^ key_b.unsqueeze(1))


def uniforms(bits: torch.Tensor) -> torch.Tensor:  # [...] int64 → [...] float64 in (0, 1)
    return (bits * 2 + 1).to(torch.float64) * 2.0**-33  # odd multiples of 2^-33: exact


def neg_log(u: torch.Tensor) -> torch.Tensor:  # [...] float64 in (0, 1) → -ln(u), float64
    m, e = torch.frexp(u)  # u = m * 2^e, m in [0.5, 1)
    low = m < _SQRT_HALF
    m = torch.where(low, m * 2, m)  # [√½, √2): m - 1 below is exact, s stays small
    e = torch.where(low, e - 1, e).to(torch.float64)
    s = (m - 1) / (m + 1)
    z = s * s
    series = torch.full_like(z, _ATANH_SERIES[0])
    for c in _ATANH_SERIES[1:]:
        series = series * z + c
    return -(e * _LN2 + s * 2 * series)


def exponential_noise(
    seeds: torch.Tensor,  # [rows] int64
    positions: torch.Tensor,  # [rows] int64
    vocab: int,
) -> torch.Tensor:  # [rows, vocab] float32 Exp(1) draws, finite and > 0
    """The noise; on the CPU by tokenmill's native kernel where it is built (the same bits in
    one pass, not some forty passes of tensor ops), else by `reference_noise`."""
    if seeds.device.type == "cpu":
        from gpu.kernels.native import cpu_kernels

        kernels = cpu_kernels()
        if kernels is not None:
            return kernels.exponential_noise(seeds.contiguous(), positions.contiguous(), vocab)
    return reference_noise(seeds, positions, vocab)


def reference_noise(
    seeds: torch.Tensor,  # [rows] int64
    positions: torch.Tensor,  # [rows] int64
    vocab: int,
) -> torch.Tensor:  # [rows, vocab] float32 Exp(1) draws, finite and > 0
    """The definition, in tensor ops any device runs (CUDA's path)."""
    return neg_log(uniforms(uniform_bits(seeds, positions, vocab))).to(torch.float32)
