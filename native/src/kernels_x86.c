/* kernels_x86.c — AVX2+FMA and AVX-512F dot products, compiled with target attributes
 * and chosen at runtime (kernels.c). Lane l of the 16 partial sums holds elements
 * i ≡ l (mod 16), exactly as the generic kernels, and the same wk_reduce16 tree finishes,
 * so results are bit-identical to generic C. */
#include <math.h>
#include <string.h>

#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
/* (avx2 implies SSSE3's pshufb, used for the E2M1 table lookup.) fp16 scales are widened by
 * F16C's vcvtph2ps, exact like wu_fp16_to_f32 (subnormals included). */

/* The four-row kernels below prefetch the next four rows (contiguous) along the way, share s
 * of `step` bytes at each step of their loop: the hardware prefetchers stop at page
 * boundaries, which rows cross often. Only when four more rows follow in the range. */
static inline __attribute__((always_inline)) void prefetch_share(const uint8_t *next, uint64_t step, uint32_t s, int more) {
    if (!more) return;
    const char *p = (const char *)next + s * step;
    for (uint64_t o = 0; o < step + 63; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* wk_reduce16 on the 16 lanes a0 (lanes 0-7), a1 (8-15) in registers: the same additions
 * in the same order (i and i+8, i and i+4, i and i+2, 0 and 1), so the same bits, without
 * the store, the reloads and the call (~7 % of a decode's cycles on an AVX2 VM). */
AVX2 static inline float reduce16_avx2(__m256 a0, __m256 a1) {
    __m256 b = _mm256_add_ps(a0, a1);
    __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

/* The same on the 16 lanes of one AVX-512 register. */
AVX512 static inline float reduce16_avx512(__m512 a) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return reduce16_avx2(_mm512_castps512_ps256(a), hi);
}

/* Tail elements continue the lane striping (n0 is a multiple of 16). */
static float tail_f32(float acc[16], const float *w, const float *x, uint32_t n0, uint32_t n) {
    for (uint32_t i = n0; i < n; i++) acc[i & 15] = __builtin_fmaf(w[i], x[i], acc[i & 15]);
    return wk_reduce16(acc);
}
static float tail_bf16(float acc[16], const uint16_t *w, const float *x, uint32_t n0, uint32_t n) {
    for (uint32_t i = n0; i < n; i++) acc[i & 15] = __builtin_fmaf(wu_bf16_to_f32(w[i]), x[i], acc[i & 15]);
    return wk_reduce16(acc);
}

AVX2 static float dot_f32_avx2(const float *w, const float *x, uint32_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    if (i == n) return reduce16_avx2(a0, a1);
    float acc[16];
    _mm256_storeu_ps(acc, a0); _mm256_storeu_ps(acc + 8, a1);
    return tail_f32(acc, w, x, i, n);
}

AVX2 static __m256 bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2 static float dot_bf16_avx2(const uint16_t *w, const float *x, uint32_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(bf16x8(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    if (i == n) return reduce16_avx2(a0, a1);
    float acc[16];
    _mm256_storeu_ps(acc, a0); _mm256_storeu_ps(acc + 8, a1);
    return tail_bf16(acc, w, x, i, n);
}

AVX2 static __m256 i8x8(const int8_t *q) {
    __m128i b = _mm_loadl_epi64((const __m128i *)q);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

/* Groups are 32 or 128 values, multiples of 16, so a group never splits a lane block. */
AVX2 static float dot_int8_avx2(const uint8_t *row, const float *x, uint32_t n, uint32_t group) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        __m256 s = _mm256_set1_ps(_cvtsh_ss(sh));
        const int8_t *q = (const int8_t *)(row + 2);
        for (uint32_t j = 0; j < group; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_mul_ps(i8x8(q + j), s), _mm256_loadu_ps(x + g0 + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_mul_ps(i8x8(q + j + 8), s), _mm256_loadu_ps(x + g0 + j + 8), a1);
        }
        row += 2 + group;
    }
    return reduce16_avx2(a0, a1);
}

/* 16 nibbles of 8 packed bytes in element order (low nibble = even element). */
AVX2 static __m128i nibbles16(const uint8_t *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(15);
    return _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}

AVX2 static __m128i e2m1x2_table(void) { return _mm_loadu_si128((const __m128i *)wk_e2m1x2); }

/* acc lanes 0..7 and 8..15 += (16 int8 v · s) ⊙ x: the int8 path, exactly. */
#define FMA16_AVX2(v, s, xp, a0, a1)                                                                  \
    do {                                                                                              \
        a0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), s),           \
                             _mm256_loadu_ps(xp), a0);                                                 \
        a1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), s), \
                             _mm256_loadu_ps((xp) + 8), a1);                                           \
    } while (0)

AVX2 static float dot_int4_avx2(const uint8_t *row, const float *x, uint32_t n, uint32_t group) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    const __m128i eight = _mm_set1_epi8(8);
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        __m256 s = _mm256_set1_ps(_cvtsh_ss(sh));
        const uint8_t *q = row + 2;
        for (uint32_t j = 0; j < group; j += 16) {
            __m128i v = _mm_sub_epi8(nibbles16(q + j / 2), eight);
            FMA16_AVX2(v, s, x + g0 + j, a0, a1);
        }
        row += 2 + group / 2;
    }
    return reduce16_avx2(a0, a1);
}

AVX2 static float dot_mxfp4_avx2(const uint8_t *row, const float *x, uint32_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    const __m128i tab = e2m1x2_table();
    for (uint32_t g0 = 0; g0 < n; g0 += 32) {
        __m256 s = _mm256_set1_ps(wk_e8m0_half(row[0]));
        for (uint32_t j = 0; j < 32; j += 16) {
            __m128i v = _mm_shuffle_epi8(tab, nibbles16(row + 1 + j / 2));
            FMA16_AVX2(v, s, x + g0 + j, a0, a1);
        }
        row += 17;
    }
    return reduce16_avx2(a0, a1);
}

AVX512 static float dot_f32_avx512(const float *w, const float *x, uint32_t n) {
    __m512 a = _mm512_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a);
    if (i == n) return reduce16_avx512(a);
    float acc[16];
    _mm512_storeu_ps(acc, a);
    return tail_f32(acc, w, x, i, n);
}

AVX512 static float dot_bf16_avx512(const uint16_t *w, const float *x, uint32_t n) {
    __m512 a = _mm512_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(w + i));
        __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i), a);
    }
    if (i == n) return reduce16_avx512(a);
    float acc[16];
    _mm512_storeu_ps(acc, a);
    return tail_bf16(acc, w, x, i, n);
}

AVX512 static float dot_int8_avx512(const uint8_t *row, const float *x, uint32_t n, uint32_t group) {
    __m512 a = _mm512_setzero_ps();
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        __m512 s = _mm512_set1_ps(_cvtsh_ss(sh));
        const int8_t *q = (const int8_t *)(row + 2);
        for (uint32_t j = 0; j < group; j += 16) {
            __m128i b = _mm_loadu_si128((const __m128i *)(q + j));
            __m512 wv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
            a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + g0 + j), a);
        }
        row += 2 + group;
    }
    return reduce16_avx512(a);
}

AVX512 static __m128i nibbles16_512(const uint8_t *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(15);
    return _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}

AVX512 static float dot_int4_avx512(const uint8_t *row, const float *x, uint32_t n, uint32_t group) {
    __m512 a = _mm512_setzero_ps();
    const __m128i eight = _mm_set1_epi8(8);
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        __m512 s = _mm512_set1_ps(_cvtsh_ss(sh));
        const uint8_t *q = row + 2;
        for (uint32_t j = 0; j < group; j += 16) {
            __m128i v = _mm_sub_epi8(nibbles16_512(q + j / 2), eight);
            __m512 wv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), s);
            a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + g0 + j), a);
        }
        row += 2 + group / 2;
    }
    return reduce16_avx512(a);
}

AVX512 static float dot_mxfp4_avx512(const uint8_t *row, const float *x, uint32_t n) {
    __m512 a = _mm512_setzero_ps();
    const __m128i tab = _mm_loadu_si128((const __m128i *)wk_e2m1x2);
    for (uint32_t g0 = 0; g0 < n; g0 += 32) {
        __m512 s = _mm512_set1_ps(wk_e8m0_half(row[0]));
        for (uint32_t j = 0; j < 32; j += 16) {
            __m128i v = _mm_shuffle_epi8(tab, nibbles16_512(row + 1 + j / 2));
            __m512 wv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), s);
            a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + g0 + j), a);
        }
        row += 17;
    }
    return reduce16_avx512(a);
}

/* ---- the q8 path (WASTE_ACT_Q8): integer dot products, then the float order of
 * wk_rows_q8_generic (internal.h). Four rows at a time share the activation loads; each row
 * is summed exactly as alone. Weights of one 32-column block as 32 int8 in column order: */
#define Q8X86 __attribute__((target("avx2,fma,f16c")))
#define Q8VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

/* fp16 → f32 is exact (vcvtph2ps), the same value as wu_fp16_to_f32, subnormals included. */
Q8X86 static inline float fp16_at(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return _cvtsh_ss(h); }

Q8X86 static inline __m256i w32_int8(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
Q8X86 static inline __m256i w32_nib(const uint8_t *p) {   /* 16 bytes, low nibble = even column */
    __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}
Q8X86 static inline __m256i w32_int4(const uint8_t *p) { return _mm256_sub_epi8(w32_nib(p), _mm256_set1_epi8(8)); }
Q8X86 static inline __m256i w32_mxfp4(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)wk_e2m1x2);
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), w32_nib(p));
}
/* p_j = Σ_{k<4} w[4j+k]·x[4j+k]: |w|·(x·sign w) as u8·s8 pairs (|w| ≤ 128, |x| ≤ 127: no
 * int16 saturation), then pairs of pairs. xa = |x| (once per block) goes unused: an int8 w
 * may be −128, which w·sign x would wrap. */
Q8X86 static inline __m256i dot_avx2(__m256i w, __m256i x, __m256i xa) {
    (void)xa;
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
/* The same integers as |x|·(w·sign x) when |w| ≤ 12 (int4, mxfp4): one vpsignb a row, not two. */
Q8X86 static inline __m256i dot_avx2_small(__m256i w, __m256i x, __m256i xa) {
    __m256i p = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
Q8VNNI static inline __m256i dot_vnni(__m256i w, __m256i x, __m256i xa) {
    (void)xa;
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}
/* dot_avx2_small's form: |x|·(w·sign x), one vpsignb a row (|w| ≤ 12: int4, mxfp4). */
Q8VNNI static inline __m256i dot_vnni_small(__m256i w, __m256i x, __m256i xa) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), xa, _mm256_sign_epi8(w, x));
}

/* The scales of four rows (rb bytes apart) at one group offset as four f32 lanes: one
 * vcvtph2ps for the four, so that scale · xs is one vmulps giving the four scalar products. */
Q8X86 static inline __m128 scales4_fp16(const uint8_t *p, uint64_t rb) {
    uint16_t h0, h1, h2, h3;
    memcpy(&h0, p, 2); memcpy(&h1, p + rb, 2); memcpy(&h2, p + 2 * rb, 2); memcpy(&h3, p + 3 * rb, 2);
    uint64_t h = h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
}
/* wk_e8m0_half on four bytes: exponent field e − 1 for e ≥ 2, the subnormals 2^−127 and
 * 2^−128 for e = 1 and 0, NaN (0x7fc00000) for 255; no call per row. */
Q8X86 static inline __m128 scales4_e8m0(const uint8_t *p, uint64_t rb) {
    uint32_t e4 = p[0] | (uint32_t)p[rb] << 8 | (uint32_t)p[2 * rb] << 16 | (uint32_t)p[3 * rb] << 24;
    __m128i e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)e4));
    __m128i v = _mm_blendv_epi8(_mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23),
                                _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e), _mm_cmpgt_epi32(_mm_set1_epi32(2), e));
    v = _mm_or_si128(v, _mm_and_si128(_mm_cmpeq_epi32(e, _mm_set1_epi32(255)), _mm_set1_epi32(0x7fc00000)));
    return _mm_castsi128_ps(v);
}
/* Lane k of d in all eight lanes. */
#define Q8_LANE(d, k) _mm256_broadcastss_ps(_mm_permute_ps(d, (k) * 0x55))

/* Block B of the four rows w0..w3 into A0..A3 (the even or the odd accumulators). */
#define Q8_BLOCK4(LOADW, DOT, SCALES4, HDR, BBYTES, B, A0, A1, A2, A3)                                      \
    do {                                                                                                      \
        const uint64_t go = (uint64_t)((B) >> sh) * gbytes, bo = go + HDR + (uint64_t)((B) & tmask) * (BBYTES); \
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * (uint64_t)(B))), xa = _mm256_abs_epi8(xv); \
        const __m128 d = _mm_mul_ps(SCALES4(w0 + go, rb), _mm_set1_ps(xd[B]));                               \
        A0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(LOADW(w0 + bo), xv, xa)), Q8_LANE(d, 0), A0);                \
        A1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(LOADW(w1 + bo), xv, xa)), Q8_LANE(d, 1), A1);                \
        A2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(LOADW(w2 + bo), xv, xa)), Q8_LANE(d, 2), A2);                \
        A3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(LOADW(w3 + bo), xv, xa)), Q8_LANE(d, 3), A3);                \
    } while (0)
#define Q8_BLOCK1(LOADW, DOT, SCALE, HDR, BBYTES, B, A0)                                                     \
    do {                                                                                                      \
        const uint64_t go = (uint64_t)((B) >> sh) * gbytes, bo = go + HDR + (uint64_t)((B) & tmask) * (BBYTES); \
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * (uint64_t)(B))), xa = _mm256_abs_epi8(xv); \
        A0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(LOADW(w0 + bo), xv, xa)), _mm256_set1_ps(SCALE(w0 + go) * xd[B]), A0); \
    } while (0)

/* NAME(m, r0, r1, xq, xd, y) for one format: HDR bytes of scale first in each group,
 * BBYTES bytes per 32-column block, SCALE(ptr) its scale, SCALES4 those of four rows. Two
 * blocks a step, the even one into a?0 and the odd into a?1, so no branch on the parity. */
#define Q8_ROWS(NAME, ATTR, LOADW, DOT, SCALE, SCALES4, HDR, BBYTES)                                         \
    ATTR static void NAME(const wm_mat *m, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xd,     \
                          float *y) {                                                                         \
        const uint32_t nb = m->cols / 32, sh = m->group == 128 ? 2 : 0, tmask = (1u << sh) - 1;             \
        const uint64_t gbytes = HDR + (uint64_t)(BBYTES) * (1u << sh), rb = m->row_bytes;                    \
        uint32_t r = r0;                                                                                      \
        for (; r + 4 <= r1; r += 4) {                                                                         \
            const uint8_t *w0 = m->data + (uint64_t)r * rb, *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;    \
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,        \
                   a30 = a00, a31 = a00;                                                                      \
            const uint32_t steps = nb / 2 ? nb / 2 : 1, next = r1 - r - 4 < 4 ? r1 - r - 4 : 4;             \
            const uint64_t pf_step = ((uint64_t)next * rb + steps - 1) / steps; /* prefetch_share */          \
            uint32_t b = 0;                                                                                   \
            for (; b + 2 <= nb; b += 2) {                                                                     \
                prefetch_share(w3 + rb, pf_step, b / 2, next != 0);                                          \
                Q8_BLOCK4(LOADW, DOT, SCALES4, HDR, BBYTES, b, a00, a10, a20, a30);                          \
                Q8_BLOCK4(LOADW, DOT, SCALES4, HDR, BBYTES, b + 1, a01, a11, a21, a31);                      \
            }                                                                                                 \
            if (b < nb) Q8_BLOCK4(LOADW, DOT, SCALES4, HDR, BBYTES, b, a00, a10, a20, a30);                  \
            y[r] = reduce16_avx2(a00, a01); y[r + 1] = reduce16_avx2(a10, a11);                              \
            y[r + 2] = reduce16_avx2(a20, a21); y[r + 3] = reduce16_avx2(a30, a31);                          \
        }                                                                                                     \
        for (; r < r1; r++) {                                                                                 \
            const uint8_t *w0 = m->data + (uint64_t)r * rb;                                                  \
            __m256 a00 = _mm256_setzero_ps(), a01 = a00;                                                      \
            uint32_t b = 0;                                                                                   \
            for (; b + 2 <= nb; b += 2) {                                                                     \
                Q8_BLOCK1(LOADW, DOT, SCALE, HDR, BBYTES, b, a00);                                            \
                Q8_BLOCK1(LOADW, DOT, SCALE, HDR, BBYTES, b + 1, a01);                                        \
            }                                                                                                 \
            if (b < nb) Q8_BLOCK1(LOADW, DOT, SCALE, HDR, BBYTES, b, a00);                                    \
            y[r] = reduce16_avx2(a00, a01);                                                                   \
        }                                                                                                     \
    }

#define SCALE_FP16(p) fp16_at(p)
#define SCALE_E8M0(p) wk_e8m0_half((p)[0])
Q8_ROWS(q8_int8_avx2, Q8X86, w32_int8, dot_avx2, SCALE_FP16, scales4_fp16, 2, 32)
Q8_ROWS(q8_int4_avx2, Q8X86, w32_int4, dot_avx2_small, SCALE_FP16, scales4_fp16, 2, 16)
Q8_ROWS(q8_mxfp4_avx2, Q8X86, w32_mxfp4, dot_avx2_small, SCALE_E8M0, scales4_e8m0, 1, 16)
Q8_ROWS(q8_int8_vnni, Q8VNNI, w32_int8, dot_vnni, SCALE_FP16, scales4_fp16, 2, 32)
Q8_ROWS(q8_int4_vnni, Q8VNNI, w32_int4, dot_vnni_small, SCALE_FP16, scales4_fp16, 2, 16)
Q8_ROWS(q8_mxfp4_vnni, Q8VNNI, w32_mxfp4, dot_vnni_small, SCALE_E8M0, scales4_e8m0, 1, 16)

static void rows_q8_avx2(const wm_mat *m, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xd, float *y) {
    if (m->fmt == WF_INT8) q8_int8_avx2(m, r0, r1, xq, xd, y);
    else if (m->fmt == WF_INT4) q8_int4_avx2(m, r0, r1, xq, xd, y);
    else q8_mxfp4_avx2(m, r0, r1, xq, xd, y);
}
static void rows_q8_vnni(const wm_mat *m, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xd, float *y) {
    if (m->fmt == WF_INT8) q8_int8_vnni(m, r0, r1, xq, xd, y);
    else if (m->fmt == WF_INT4) q8_int4_vnni(m, r0, r1, xq, xd, y);
    else q8_mxfp4_vnni(m, r0, r1, xq, xd, y);
}

/* The f32-activation rows: each row through the set's own dot. */
#define ROWS_LOOP(NAME, F32, BF16, I8, I4, MX)                                                           \
    static void NAME(const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, float *y) {               \
        for (uint32_t r = r0; r < r1; r++) {                                                             \
            const uint8_t *row = m->data + (uint64_t)r * m->row_bytes;                                  \
            switch (m->fmt) {                                                                            \
            case WF_F32: y[r] = F32((const float *)row, x, m->cols); break;                              \
            case WF_BF16: y[r] = BF16((const uint16_t *)row, x, m->cols); break;                         \
            case WF_INT8: y[r] = I8(row, x, m->cols, m->group); break;                                   \
            case WF_INT4: y[r] = I4(row, x, m->cols, m->group); break;                                   \
            default: y[r] = MX(row, x, m->cols); break;                                                  \
            }                                                                                            \
        }                                                                                                \
    }
/* AVX-512, f32 activations, four rows at a time: each row's 16 lanes get exactly the
 * operations of dot_*_avx512 in the same order (w = (float)q · s, then fma with x); the four
 * independent chains hide the FMA latency that bounds a single row, and x is loaded once. */
AVX512 static inline __m128i i16_int8(const uint8_t *q, uint32_t j) { return _mm_loadu_si128((const __m128i *)(q + j)); }
AVX512 static inline __m128i i16_int4(const uint8_t *q, uint32_t j) {
    return _mm_sub_epi8(nibbles16_512(q + j / 2), _mm_set1_epi8(8));
}
AVX512 static inline __m128i i16_mxfp4(const uint8_t *q, uint32_t j) {
    return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)wk_e2m1x2), nibbles16_512(q + j / 2));
}
AVX512 static inline float scale_fp16(const uint8_t *g) { uint16_t h; memcpy(&h, g, 2); return _cvtsh_ss(h); }
static inline float scale_e8m0(const uint8_t *g) { return wk_e8m0_half(g[0]); }
#define ROWS4_512(NAME, LOAD16, SCALE, HDR, GBYTES, GCOLS, SINGLE)                                           \
    AVX512 static void NAME(const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, float *y) {          \
        const uint32_t gc = GCOLS, ng = m->cols / gc;                                                        \
        const uint64_t gb = GBYTES, rb = m->row_bytes;                                                       \
        uint32_t r = r0;                                                                                      \
        for (; r + 4 <= r1; r += 4) {                                                                         \
            const uint8_t *w0 = m->data + (uint64_t)r * rb, *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;   \
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                      \
            const uint64_t pf_step = (4 * rb + ng - 1) / ng; /* prefetch_share */                             \
            for (uint32_t g = 0; g < ng; g++) {                                                               \
                const uint64_t go = (uint64_t)g * gb;                                                         \
                prefetch_share(w0 + 4 * rb, pf_step, g, r + 8 <= r1);                                        \
                __m512 s0 = _mm512_set1_ps(SCALE(w0 + go)), s1 = _mm512_set1_ps(SCALE(w1 + go));             \
                __m512 s2 = _mm512_set1_ps(SCALE(w2 + go)), s3 = _mm512_set1_ps(SCALE(w3 + go));             \
                const uint8_t *q0 = w0 + go + HDR, *q1 = w1 + go + HDR, *q2 = w2 + go + HDR, *q3 = w3 + go + HDR; \
                for (uint32_t j = 0; j < gc; j += 16) {                                                       \
                    __m512 xv = _mm512_loadu_ps(x + (uint64_t)g * gc + j);                                    \
                    a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(LOAD16(q0, j))), s0), xv, a0); \
                    a1 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(LOAD16(q1, j))), s1), xv, a1); \
                    a2 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(LOAD16(q2, j))), s2), xv, a2); \
                    a3 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(LOAD16(q3, j))), s3), xv, a3); \
                }                                                                                             \
            }                                                                                                 \
            y[r] = reduce16_avx512(a0); y[r + 1] = reduce16_avx512(a1);                                      \
            y[r + 2] = reduce16_avx512(a2); y[r + 3] = reduce16_avx512(a3);                                  \
        }                                                                                                     \
        for (; r < r1; r++) y[r] = SINGLE;                                                                    \
    }
ROWS4_512(rows4_int8_avx512, i16_int8, scale_fp16, 2, 2 + m->group, m->group,
          dot_int8_avx512(m->data + (uint64_t)r * rb, x, m->cols, m->group))
ROWS4_512(rows4_int4_avx512, i16_int4, scale_fp16, 2, 2 + m->group / 2, m->group,
          dot_int4_avx512(m->data + (uint64_t)r * rb, x, m->cols, m->group))
ROWS4_512(rows4_mxfp4_avx512, i16_mxfp4, scale_e8m0, 1, 17, 32, dot_mxfp4_avx512(m->data + (uint64_t)r * rb, x, m->cols))

ROWS_LOOP(rows_avx2, dot_f32_avx2, dot_bf16_avx2, dot_int8_avx2, dot_int4_avx2, dot_mxfp4_avx2)
ROWS_LOOP(rows1_avx512, dot_f32_avx512, dot_bf16_avx512, dot_int8_avx512, dot_int4_avx512, dot_mxfp4_avx512)
static void rows_avx512(const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, float *y) {
    if (m->fmt == WF_INT8) rows4_int8_avx512(m, r0, r1, x, y);
    else if (m->fmt == WF_INT4) rows4_int4_avx512(m, r0, r1, x, y);
    else if (m->fmt == WF_MXFP4) rows4_mxfp4_avx512(m, r0, r1, x, y);
    else rows1_avx512(m, r0, r1, x, y);
}

/* KDA state rows and the f32 axpy: separate multiplies and adds (no FMA), so each element is
 * the generic one; the tail is the generic loop. One body per vector width. */
#define KDA_ROWS(W, ATTR, V, LANES, LOAD, STORE, MUL, ADD, SET1)                                           \
    ATTR static void decay_read_##W(float *s, float e, float k, float *r, uint32_t n) {                  \
        V ve = SET1(e), vk = SET1(k);                                                                     \
        uint32_t j = 0;                                                                                   \
        for (; j + LANES <= n; j += LANES) {                                                              \
            V sj = MUL(LOAD(s + j), ve);                                                                  \
            STORE(s + j, sj);                                                                             \
            STORE(r + j, ADD(LOAD(r + j), MUL(sj, vk)));                                                  \
        }                                                                                                 \
        wk_decay_read_generic(s + j, e, k, r + j, n - j);                                                 \
    }                                                                                                     \
    ATTR static void update_read_##W(float *s, float k, const float *delta, float q, float *o, uint32_t n) { \
        V vk = SET1(k), vq = SET1(q);                                                                     \
        uint32_t j = 0;                                                                                   \
        for (; j + LANES <= n; j += LANES) {                                                              \
            V sj = ADD(LOAD(s + j), MUL(vk, LOAD(delta + j)));                                            \
            STORE(s + j, sj);                                                                             \
            STORE(o + j, ADD(LOAD(o + j), MUL(sj, vq)));                                                  \
        }                                                                                                 \
        wk_update_read_generic(s + j, k, delta + j, q, o + j, n - j);                                     \
    }                                                                                                     \
    ATTR static void axpy_f32_##W(float *y, float a, const float *x, uint32_t n) {                        \
        V va = SET1(a);                                                                                   \
        uint32_t j = 0;                                                                                   \
        for (; j + LANES <= n; j += LANES) STORE(y + j, ADD(LOAD(y + j), MUL(va, LOAD(x + j))));          \
        wk_axpy_f32_generic(y + j, a, x + j, n - j);                                                      \
    }
KDA_ROWS(avx2, AVX2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_set1_ps)
KDA_ROWS(avx512, AVX512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_set1_ps)

/* int8 row axpy: the weight (q as float times the group scale), the product and the sum as
 * separate operations, so each element is the generic one. Groups are 32 or 128 (the
 * container refuses others): whole vectors of either width. */
AVX2 static __m256 int8x8_ps(const int8_t *q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))); }
AVX512 static __m512 int8x16_ps(const int8_t *q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))); }
#define AXPY_INT8(W, ATTR, V, LANES, LOADQ, LOAD, STORE, MUL, ADD, SET1)                                    \
    ATTR static void axpy_int8_##W(const uint8_t *row, float a, float *y, uint32_t n, uint32_t group) {     \
        V va = SET1(a);                                                                                   \
        for (uint32_t g0 = 0; g0 < n; g0 += group) {                                                      \
            uint16_t sh; memcpy(&sh, row, 2);                                                             \
            V vs = SET1(_cvtsh_ss(sh));                                                                   \
            const int8_t *q = (const int8_t *)(row + 2);                                                  \
            for (uint32_t j = 0; j < group; j += LANES)                                                   \
                STORE(y + g0 + j, ADD(LOAD(y + g0 + j), MUL(va, MUL(LOADQ(q + j), vs))));                 \
            row += 2 + group;                                                                             \
        }                                                                                                 \
    }
AXPY_INT8(avx2, AVX2, __m256, 8, int8x8_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_set1_ps)
AXPY_INT8(avx512, AVX512, __m512, 16, int8x16_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_mul_ps, _mm512_add_ps,
          _mm512_set1_ps)

/* exp over floats, four lanes in double: numerics.c's wn_exp step for step (the same IEEE
 * double operations in the same order, no FMA), so each lane is wn_expf's bits. |x| ≤ 700
 * keeps k = round(x/ln2) in [-1010, 1010], where 2^k is a plain exponent; a group of four
 * holding a NaN or a larger |x| goes through wn_expf instead, as does the tail. */
AVX2 static void exp_f32_avx2(const float *x, float *y, uint32_t n) {
    const __m256d lim = _mm256_set1_pd(700.0), half = _mm256_set1_pd(0.5), nhalf = _mm256_set1_pd(-0.5);
    const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0), two = _mm256_set1_pd(2.0);
    const __m256d ln2_hi = _mm256_set1_pd(6.93147180369123816490e-01), ln2_lo = _mm256_set1_pd(1.90821492927058770002e-10);
    const __m256d inv_ln2 = _mm256_set1_pd(1.44269504088896338700e+00);
    const __m256d p1 = _mm256_set1_pd(1.66666666666666019037e-01), p2 = _mm256_set1_pd(-2.77777777770155933842e-03),
                  p3 = _mm256_set1_pd(6.61375632143793436117e-05), p4 = _mm256_set1_pd(-1.65339022054652515390e-06),
                  p5 = _mm256_set1_pd(4.13813679705723846039e-08);
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        /* NaN compares false: !(|v| <= 700) catches it with the large lanes */
        if (_mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(v, absmask), lim, _CMP_LE_OQ)) != 0xF) {
            for (uint32_t l = 0; l < 4; l++) y[i + l] = wn_expf(x[i + l]);
            continue;
        }
        __m256d sgn = _mm256_blendv_pd(half, nhalf, _mm256_cmp_pd(v, zero, _CMP_LT_OQ));
        __m128i k = _mm256_cvttpd_epi32(_mm256_add_pd(_mm256_mul_pd(v, inv_ln2), sgn));
        __m256d dk = _mm256_cvtepi32_pd(k);
        __m256d hi = _mm256_sub_pd(v, _mm256_mul_pd(dk, ln2_hi)), lo = _mm256_mul_pd(dk, ln2_lo);
        __m256d r = _mm256_sub_pd(hi, lo), t = _mm256_mul_pd(r, r);
        __m256d poly = _mm256_add_pd(p4, _mm256_mul_pd(t, p5));
        poly = _mm256_add_pd(p3, _mm256_mul_pd(t, poly));
        poly = _mm256_add_pd(p2, _mm256_mul_pd(t, poly));
        poly = _mm256_add_pd(p1, _mm256_mul_pd(t, poly));
        __m256d c = _mm256_sub_pd(r, _mm256_mul_pd(t, poly));
        __m256d q = _mm256_div_pd(_mm256_mul_pd(r, c), _mm256_sub_pd(two, c));
        __m256d e = _mm256_sub_pd(one, _mm256_sub_pd(_mm256_sub_pd(lo, q), hi));
        __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(k), _mm256_set1_epi64x(1023)), 52);
        _mm_storeu_ps(y + i, _mm256_cvtpd_ps(_mm256_mul_pd(e, _mm256_castsi256_pd(bits))));
    }
    for (; i < n; i++) y[i] = wn_expf(x[i]);
}

/* wk_quantize_q8 by eight lanes: the block max of |x| by vmaxps (every lane finite), then
 * q = round-half-even(x · (127 / a)) by vroundps (nearbyintf's rounding in the default mode),
 * packed to int8 in column order. A block holding a NaN or an infinity, or whose max is so
 * small that 127 / a overflows, goes to the generic code, which handles those. */
AVX2 static void quantize_q8_avx2(const float *x, uint32_t n, int8_t *xq, float *xd) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(3.40282347e38f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (uint32_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4], m = _mm256_setzero_ps();
        int bad = 0;
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            __m256 av = _mm256_and_ps(v[i], absmask);
            bad |= _mm256_movemask_ps(_mm256_cmp_ps(av, big, _CMP_NLE_UQ));   /* NaN or > FLT_MAX */
            m = _mm256_max_ps(m, av);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float a = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        float inv = a > 0.0f ? 127.0f / a : 0.0f;
        if (bad || isinf(inv)) { wk_quantize_q8(xb, 32, xq + 32 * b, xd + b); continue; }
        xd[b] = a / 127.0f;
        const __m256 s = _mm256_set1_ps(inv);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(xq + 32 * b), _mm256_permutevar8x32_epi32(p, order));
    }
}

const wk_kernels wk_avx2_kernels = {"avx2", dot_f32_avx2, dot_bf16_avx2, dot_int8_avx2, dot_int4_avx2, dot_mxfp4_avx2,
                                    rows_avx2, rows_q8_avx2, decay_read_avx2, update_read_avx2, axpy_int8_avx2,
                                    exp_f32_avx2, axpy_f32_avx2, quantize_q8_avx2};
const wk_kernels wk_avx512_kernels = {"avx512", dot_f32_avx512, dot_bf16_avx512, dot_int8_avx512, dot_int4_avx512,
                                      dot_mxfp4_avx512, rows_avx512, rows_q8_avx2, decay_read_avx512,
                                      update_read_avx512, axpy_int8_avx512, exp_f32_avx2, axpy_f32_avx512,
                                      quantize_q8_avx2};
/* AVX-512 with VNNI (and VL, BW): the same set, its q8 integer dots by vpdpbusd (exact, so
 * the same bits as the maddubs form). */
const wk_kernels wk_avx512vnni_kernels = {"avx512", dot_f32_avx512, dot_bf16_avx512, dot_int8_avx512, dot_int4_avx512,
                                          dot_mxfp4_avx512, rows_avx512, rows_q8_vnni, decay_read_avx512,
                                          update_read_avx512, axpy_int8_avx512, exp_f32_avx2, axpy_f32_avx512,
                                          quantize_q8_avx2};
#endif
