/* kernels_x86.c — AVX2+FMA and AVX-512F dot products, compiled with target attributes
 * and chosen at runtime (kernels.c). Lane l of the 16 partial sums holds elements
 * i ≡ l (mod 16), exactly as the generic kernels, and the same wk_reduce16 tree finishes,
 * so results are bit-identical to generic C. */
#include <string.h>

#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
/* (avx2 implies SSSE3's pshufb, used for the E2M1 table lookup.) */

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
        __m256 s = _mm256_set1_ps(wu_fp16_to_f32(sh));
        const int8_t *q = (const int8_t *)(row + 2);
        for (uint32_t j = 0; j < group; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_mul_ps(i8x8(q + j), s), _mm256_loadu_ps(x + g0 + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_mul_ps(i8x8(q + j + 8), s), _mm256_loadu_ps(x + g0 + j + 8), a1);
        }
        row += 2 + group;
    }
    float acc[16];
    _mm256_storeu_ps(acc, a0); _mm256_storeu_ps(acc + 8, a1);
    return wk_reduce16(acc);
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
        __m256 s = _mm256_set1_ps(wu_fp16_to_f32(sh));
        const uint8_t *q = row + 2;
        for (uint32_t j = 0; j < group; j += 16) {
            __m128i v = _mm_sub_epi8(nibbles16(q + j / 2), eight);
            FMA16_AVX2(v, s, x + g0 + j, a0, a1);
        }
        row += 2 + group / 2;
    }
    float acc[16];
    _mm256_storeu_ps(acc, a0); _mm256_storeu_ps(acc + 8, a1);
    return wk_reduce16(acc);
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
    float acc[16];
    _mm256_storeu_ps(acc, a0); _mm256_storeu_ps(acc + 8, a1);
    return wk_reduce16(acc);
}

AVX512 static float dot_f32_avx512(const float *w, const float *x, uint32_t n) {
    __m512 a = _mm512_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a);
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
    float acc[16];
    _mm512_storeu_ps(acc, a);
    return tail_bf16(acc, w, x, i, n);
}

AVX512 static float dot_int8_avx512(const uint8_t *row, const float *x, uint32_t n, uint32_t group) {
    __m512 a = _mm512_setzero_ps();
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        __m512 s = _mm512_set1_ps(wu_fp16_to_f32(sh));
        const int8_t *q = (const int8_t *)(row + 2);
        for (uint32_t j = 0; j < group; j += 16) {
            __m128i b = _mm_loadu_si128((const __m128i *)(q + j));
            __m512 wv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
            a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + g0 + j), a);
        }
        row += 2 + group;
    }
    float acc[16];
    _mm512_storeu_ps(acc, a);
    return wk_reduce16(acc);
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
        __m512 s = _mm512_set1_ps(wu_fp16_to_f32(sh));
        const uint8_t *q = row + 2;
        for (uint32_t j = 0; j < group; j += 16) {
            __m128i v = _mm_sub_epi8(nibbles16_512(q + j / 2), eight);
            __m512 wv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), s);
            a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + g0 + j), a);
        }
        row += 2 + group / 2;
    }
    float acc[16];
    _mm512_storeu_ps(acc, a);
    return wk_reduce16(acc);
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
    float acc[16];
    _mm512_storeu_ps(acc, a);
    return wk_reduce16(acc);
}

const wk_kernels wk_avx2_kernels = {"avx2", dot_f32_avx2, dot_bf16_avx2, dot_int8_avx2, dot_int4_avx2, dot_mxfp4_avx2};
const wk_kernels wk_avx512_kernels = {"avx512", dot_f32_avx512, dot_bf16_avx512, dot_int8_avx512, dot_int4_avx512,
                                      dot_mxfp4_avx512};
#endif
