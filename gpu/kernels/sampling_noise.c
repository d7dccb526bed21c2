/* The sampler's Exp(1) noise on the CPU: the same bits as gpu/sampling_noise.py, fast.
 *
 * Row r's noise for token t is a pure function of (seeds[r], positions[r], t): two lowbias32
 * mixes of t with the row's two keys give 32 bits h, U = (2h + 1) / 2^33, and E = -ln(U) from
 * the exponent and mantissa of U and an atanh series in double precision. Only IEEE basic
 * operations (+, -, *, /, each correctly rounded) are used, in the order the Python reference
 * uses them, and no operation may be fused into a multiply-add (the pragmas below): so this
 * gives that reference's bits exactly, on every instruction set (the tests compare them).
 */
#pragma STDC FP_CONTRACT OFF
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <stdint.h>
#include <string.h>

#define KEY_A 0x243F6A88u
#define KEY_B 0x85A308D3u

static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

static uint32_t row_key(uint32_t start, const uint32_t words[4]) {
    uint32_t h = mix32(words[0] ^ start);
    for (int i = 1; i < 4; i++) h = mix32(h ^ words[i]);
    return h;
}

/* -ln(u) for u in (0, 1), a normal double: u = m · 2^e with m in [0.5, 1), moved to
 * [√½, √2) so that s = (m - 1) / (m + 1) stays small; ln(u) = e·ln 2 + 2·atanh(s). */
static inline double neg_log(double u) {
    uint64_t bits;
    memcpy(&bits, &u, sizeof bits);
    int64_t e = (int64_t)((bits >> 52) & 0x7FF) - 1022;
    bits = (bits & ~(0x7FFull << 52)) | (1022ull << 52);
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m < 0.7071067811865476) { /* math.sqrt(0.5) */
        m = m * 2;
        e = e - 1;
    }
    double s = (m - 1) / (m + 1);
    double z = s * s;
    double series = 1.0 / 11;
    series = series * z + 1.0 / 9;
    series = series * z + 1.0 / 7;
    series = series * z + 1.0 / 5;
    series = series * z + 1.0 / 3;
    series = series * z + 1.0;
    return -((double)e * 0.6931471805599453 + s * 2 * series); /* math.log(2.0) */
}

/* out[r, t] = E for row r, token t; seeds and positions non-negative int64 (63 bits). */
void tm_exponential_noise(const int64_t *seeds, const int64_t *positions, int64_t rows,
                          int64_t vocab, float *out) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        uint64_t seed = (uint64_t)seeds[r], position = (uint64_t)positions[r];
        const uint32_t words[4] = {(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)position,
                                   (uint32_t)(position >> 32)};
        uint32_t key_a = row_key(KEY_A, words), key_b = row_key(KEY_B, words);
        float *row = out + r * vocab;
        for (int64_t t = 0; t < vocab; t++) {
            uint32_t h = mix32(mix32((uint32_t)t ^ key_a) ^ key_b);
            double u = (double)(2 * (uint64_t)h + 1) * 0x1p-33;
            row[t] = (float)neg_log(u);
        }
    }
}
