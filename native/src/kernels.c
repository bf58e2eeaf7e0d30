/* kernels.c — dot products for every weight format, the generic C versions, runtime
 * dispatch, and row decoding.
 *
 * Every dot product uses 16 lane-striped partial sums (element i goes to lane i mod 16,
 * accumulated with a fused multiply-add) reduced by one fixed tree (wk_reduce16), so the
 * generic, AVX2 and AVX-512 kernels give bit-identical results. Quantized weights are
 * decoded group by group inside the dot product (w = q·s rounded to f32, then fma); no
 * kernel ever expands a matrix into an f32 buffer.
 *
 * int4 (docs/FORMAT.md §2 code 3): w = (float)(nibble − 8) · s, s the group's fp16 scale.
 * mxfp4 (code 4): w = (float)E2M1x2[nibble] · (2^(e−127)/2), where E2M1x2 holds twice the
 * E2M1 value as an integer (so the SIMD kernels can widen it exactly like int8) and the
 * halved scale is exact for every e in 0..254: the product is the same real number as
 * E2M1(nibble)·2^(e−127) and rounds identically (−0 decodes as +0, equal in value).
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/* The tree: lanes i and i+8, then i and i+4, i and i+2, then 0 and 1. Written out (the
 * loop form cost ~a third of the instructions of a decode on a tiny model, where rows are
 * short); the same additions in the same order, so the same bits. */
float wk_reduce16(float acc[16]) {
    float b0 = acc[0] + acc[8], b1 = acc[1] + acc[9], b2 = acc[2] + acc[10], b3 = acc[3] + acc[11];
    float b4 = acc[4] + acc[12], b5 = acc[5] + acc[13], b6 = acc[6] + acc[14], b7 = acc[7] + acc[15];
    float c0 = b0 + b4, c1 = b1 + b5, c2 = b2 + b6, c3 = b3 + b7;
    float d0 = c0 + c2, d1 = c1 + c3;
    return d0 + d1;
}

float wk_dot_f32_generic(const float *w, const float *x, uint32_t n) {
    float acc[16] = {0};
    for (uint32_t i = 0; i < n; i++) acc[i & 15] = fmaf(w[i], x[i], acc[i & 15]);
    return wk_reduce16(acc);
}

float wk_dot_bf16_generic(const uint16_t *w, const float *x, uint32_t n) {
    float acc[16] = {0};
    for (uint32_t i = 0; i < n; i++) acc[i & 15] = fmaf(wu_bf16_to_f32(w[i]), x[i], acc[i & 15]);
    return wk_reduce16(acc);
}

float wk_dot_int8_generic(const uint8_t *row, const float *x, uint32_t n, uint32_t group) {
    float acc[16] = {0};
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        float s = wu_fp16_to_f32(sh);
        const int8_t *q = (const int8_t *)(row + 2);
        for (uint32_t j = 0; j < group; j++) {
            uint32_t i = g0 + j;
            acc[i & 15] = fmaf((float)q[j] * s, x[i], acc[i & 15]);
        }
        row += 2 + group;
    }
    return wk_reduce16(acc);
}

/* E2M1 nibble (sign = bit 3) → 2·value, an exact small integer. */
const int8_t wk_e2m1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float wk_e2m1(uint8_t nibble) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[nibble & 7];
    return (nibble & 8) ? -v : v;
}

static float f32_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* 2^(e−127) for e in 0..254 (e = 0 is the f32 subnormal 2^−127); e = 255 (NaN in E8M0) is
 * refused when a record or tensor is loaded, and decodes as NaN here. */
float wk_e8m0(uint8_t e) {
    if (e == 255) return NAN;
    return e ? f32_bits((uint32_t)e << 23) : f32_bits(0x00400000u);
}

/* 2^(e−128): half the scale, exact for every e in 0..254 (2^−128 is subnormal). */
float wk_e8m0_half(uint8_t e) {
    if (e == 255) return NAN;
    if (e >= 2) return f32_bits((uint32_t)(e - 1) << 23);
    return f32_bits(e ? 0x00400000u : 0x00200000u);
}

float wk_dot_int4_generic(const uint8_t *row, const float *x, uint32_t n, uint32_t group) {
    float acc[16] = {0};
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        float s = wu_fp16_to_f32(sh);
        const uint8_t *q = row + 2;
        for (uint32_t j = 0; j < group; j++) {
            uint32_t i = g0 + j;
            int nib = (q[j >> 1] >> ((j & 1) * 4)) & 15;
            acc[i & 15] = fmaf((float)(nib - 8) * s, x[i], acc[i & 15]);
        }
        row += 2 + group / 2;
    }
    return wk_reduce16(acc);
}

float wk_dot_mxfp4_generic(const uint8_t *row, const float *x, uint32_t n) {
    float acc[16] = {0};
    for (uint32_t g0 = 0; g0 < n; g0 += 32) {
        float hs = wk_e8m0_half(row[0]);
        const uint8_t *q = row + 1;
        for (uint32_t j = 0; j < 32; j++) {
            uint32_t i = g0 + j;
            int nib = (q[j >> 1] >> ((j & 1) * 4)) & 15;
            acc[i & 15] = fmaf((float)wk_e2m1x2[nib] * hs, x[i], acc[i & 15]);
        }
        row += 17;
    }
    return wk_reduce16(acc);
}

void wk_rows_f32act_generic(const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, float *y) {
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *row = m->data + (uint64_t)r * m->row_bytes;
        switch (m->fmt) {
        case WF_F32: y[r] = wk_dot_f32_generic((const float *)row, x, m->cols); break;
        case WF_BF16: y[r] = wk_dot_bf16_generic((const uint16_t *)row, x, m->cols); break;
        case WF_INT8: y[r] = wk_dot_int8_generic(row, x, m->cols, m->group); break;
        case WF_INT4: y[r] = wk_dot_int4_generic(row, x, m->cols, m->group); break;
        case WF_MXFP4: y[r] = wk_dot_mxfp4_generic(row, x, m->cols); break;
        default: y[r] = NAN; /* unreachable: open refuses other formats */
        }
    }
}

/* ---- the q8 path (WASTE_ACT_Q8) --------------------------------------------------- */

void wk_quantize_q8(const float *x, uint32_t n, int8_t *xq, float *xd) {
    for (uint32_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        int8_t *qb = xq + 32 * b;
        float a = 0.0f;
        int finite = 1;
        for (uint32_t j = 0; j < 32; j++) {
            float v = fabsf(xb[j]);
            if (!(v <= 3.40282347e38f)) finite = 0;
            else if (v > a) a = v;
        }
        if (!finite) { xd[b] = NAN; memset(qb, 0, 32); continue; }
        xd[b] = a / 127.0f;
        float inv = a > 0.0f ? 127.0f / a : 0.0f;
        int tiny = isinf(inv);   /* a subnormal max: 127 / a overflows, divide instead */
        for (uint32_t j = 0; j < 32; j++) {
            float q = nearbyintf(tiny ? xb[j] / a * 127.0f : xb[j] * inv);
            if (q > 127.0f) q = 127.0f;
            if (q < -127.0f) q = -127.0f;
            qb[j] = (int8_t)q;
        }
    }
}

/* Block b (32 columns) of a quantized row as 32 int8 values; returns its scale. */
static float block_q8(const wm_mat *m, const uint8_t *row, uint32_t b, int8_t w[32]) {
    uint32_t c0 = 32 * b;
    uint16_t sh;
    switch (m->fmt) {
    case WF_INT8: {
        const uint8_t *g = row + (uint64_t)(c0 / m->group) * (2 + m->group);
        memcpy(&sh, g, 2);
        memcpy(w, g + 2 + c0 % m->group, 32);
        return wu_fp16_to_f32(sh);
    }
    case WF_INT4: {
        const uint8_t *g = row + (uint64_t)(c0 / m->group) * (2 + m->group / 2);
        memcpy(&sh, g, 2);
        const uint8_t *q = g + 2 + (c0 % m->group) / 2;
        for (uint32_t j = 0; j < 32; j++) w[j] = (int8_t)(((q[j >> 1] >> ((j & 1) * 4)) & 15) - 8);
        return wu_fp16_to_f32(sh);
    }
    default: {   /* WF_MXFP4 */
        const uint8_t *g = row + (uint64_t)b * 17;
        for (uint32_t j = 0; j < 32; j++) w[j] = wk_e2m1x2[(g[1 + (j >> 1)] >> ((j & 1) * 4)) & 15];
        return wk_e8m0_half(g[0]);
    }
    }
}

void wk_rows_q8_generic(const wm_mat *m, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xd, float *y) {
    int8_t w[32];
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *row = m->data + (uint64_t)r * m->row_bytes;
        float acc[16] = {0};
        for (uint32_t b = 0; b < m->cols / 32; b++) {
            float d = block_q8(m, row, b, w) * xd[b];
            const int8_t *xb = xq + 32 * b;
            for (uint32_t j = 0; j < 8; j++) {
                int32_t p = w[4 * j] * xb[4 * j] + w[4 * j + 1] * xb[4 * j + 1] + w[4 * j + 2] * xb[4 * j + 2] +
                            w[4 * j + 3] * xb[4 * j + 3];
                acc[8 * (b & 1) + j] = fmaf((float)p, d, acc[8 * (b & 1) + j]);
            }
        }
        y[r] = wk_reduce16(acc);
    }
}

void wk_matvec_rows(const wk_kernels *k, const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, const int8_t *xq,
                    const float *xd, float *y) {
    if (xq && wk_q8_format(m->fmt)) k->rows_q8(m, r0, r1, xq, xd, y);
    else k->rows(m, r0, r1, x, y);
}

void wk_decay_read_generic(float *s, float e, float k, float *r, uint32_t n) {
    for (uint32_t j = 0; j < n; j++) {
        s[j] = s[j] * e;
        float p = s[j] * k;
        r[j] = r[j] + p;
    }
}

void wk_update_read_generic(float *s, float k, const float *delta, float q, float *o, uint32_t n) {
    for (uint32_t j = 0; j < n; j++) {
        float p = k * delta[j];
        s[j] = s[j] + p;
        float t = s[j] * q;
        o[j] = o[j] + t;
    }
}

void wk_axpy_int8_generic(const uint8_t *row, float a, float *y, uint32_t n, uint32_t group) {
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
        uint16_t sh; memcpy(&sh, row, 2);
        float s = wu_fp16_to_f32(sh);
        const int8_t *q = (const int8_t *)(row + 2);
        for (uint32_t j = 0; j < group; j++) {
            float w = (float)q[j] * s;
            float p = a * w;
            y[g0 + j] = y[g0 + j] + p;
        }
        row += 2 + group;
    }
}

void wk_exp_f32_generic(const float *x, float *y, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = wn_expf(x[i]);
}

void wk_axpy_f32_generic(float *y, float a, const float *x, uint32_t n) {
    for (uint32_t j = 0; j < n; j++) {
        float p = a * x[j];
        y[j] = y[j] + p;
    }
}

static const wk_kernels generic_kernels = {
    "generic", wk_dot_f32_generic, wk_dot_bf16_generic, wk_dot_int8_generic, wk_dot_int4_generic,
    wk_dot_mxfp4_generic, wk_rows_f32act_generic, wk_rows_q8_generic,
    wk_decay_read_generic, wk_update_read_generic, wk_axpy_int8_generic, wk_exp_f32_generic, wk_axpy_f32_generic,
    wk_quantize_q8,
};

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

const wk_kernels *wk_select(int32_t cfg, const char **why) {
    if (why) *why = NULL;
    if (cfg == WASTE_KERNELS_GENERIC) return &generic_kernels;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int f16c = cpu_has_f16c();
    int avx512 = __builtin_cpu_supports("avx512f") && f16c;
    int vnni = avx512 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (cfg == WASTE_KERNELS_AVX512) {
        if (!avx512 && why) *why = "this CPU lacks AVX-512F or F16C";
        return avx512 ? (vnni ? &wk_avx512vnni_kernels : &wk_avx512_kernels) : NULL;
    }
    if (cfg == WASTE_KERNELS_AVX2) {
        if (!avx2 && why) *why = "this CPU lacks AVX2, FMA or F16C";
        return avx2 ? &wk_avx2_kernels : NULL;
    }
    if (avx512) return vnni ? &wk_avx512vnni_kernels : &wk_avx512_kernels;
    if (avx2) return &wk_avx2_kernels;
#else
    if (cfg == WASTE_KERNELS_AVX2 || cfg == WASTE_KERNELS_AVX512) {
        if (why) *why = "this build has no x86 kernels";
        return NULL;
    }
#endif
    return &generic_kernels;
}

const char *wk_built(void) {
#if defined(__x86_64__) || defined(__i386__)
    return "generic,avx2,avx512";
#else
    return "generic";
#endif
}

const char *wk_best(void) { return wk_select(WASTE_KERNELS_AUTO, NULL)->name; }

float wk_dot_row(const wk_kernels *k, const wm_mat *m, uint32_t r, const float *x) {
    const uint8_t *row = m->data + (uint64_t)r * m->row_bytes;
    switch (m->fmt) {
    case WF_F32: return k->dot_f32((const float *)row, x, m->cols);
    case WF_BF16: return k->dot_bf16((const uint16_t *)row, x, m->cols);
    case WF_INT8: return k->dot_int8(row, x, m->cols, m->group);
    case WF_INT4: return k->dot_int4(row, x, m->cols, m->group);
    case WF_MXFP4: return k->dot_mxfp4(row, x, m->cols);
    default: return NAN; /* unreachable: open refuses other formats */
    }
}

void wk_decode_row(const wm_mat *m, uint32_t r, float *out) {
    const uint8_t *row = m->data + (uint64_t)r * m->row_bytes;
    switch (m->fmt) {
    case WF_F32: memcpy(out, row, (size_t)m->cols * 4); break;
    case WF_BF16:
        for (uint32_t i = 0; i < m->cols; i++) { uint16_t b; memcpy(&b, row + 2 * i, 2); out[i] = wu_bf16_to_f32(b); }
        break;
    case WF_INT8:
        for (uint32_t g0 = 0; g0 < m->cols; g0 += m->group) {
            uint16_t sh; memcpy(&sh, row, 2);
            float s = wu_fp16_to_f32(sh);
            const int8_t *q = (const int8_t *)(row + 2);
            for (uint32_t j = 0; j < m->group; j++) out[g0 + j] = (float)q[j] * s;
            row += 2 + m->group;
        }
        break;
    case WF_INT4:
        for (uint32_t g0 = 0; g0 < m->cols; g0 += m->group) {
            uint16_t sh; memcpy(&sh, row, 2);
            float s = wu_fp16_to_f32(sh);
            for (uint32_t j = 0; j < m->group; j++) out[g0 + j] = (float)(((row[2 + (j >> 1)] >> ((j & 1) * 4)) & 15) - 8) * s;
            row += 2 + m->group / 2;
        }
        break;
    case WF_MXFP4:
        for (uint32_t g0 = 0; g0 < m->cols; g0 += 32) {
            float hs = wk_e8m0_half(row[0]);
            for (uint32_t j = 0; j < 32; j++) out[g0 + j] = (float)wk_e2m1x2[(row[1 + (j >> 1)] >> ((j & 1) * 4)) & 15] * hs;
            row += 17;
        }
        break;
    default: for (uint32_t i = 0; i < m->cols; i++) out[i] = NAN;
    }
}

void wk_axpy_row(const wk_kernels *k, const wm_mat *m, uint32_t r, float a, float *y, float *scratch) {
    if (m->fmt == WF_INT8) { k->axpy_int8(m->data + (uint64_t)r * m->row_bytes, a, y, m->cols, m->group); return; }
    wk_decode_row(m, r, scratch);
    k->axpy_f32(y, a, scratch, m->cols);
}

int wk_mxfp4_find_nan_scale(const uint8_t *data, uint32_t rows, uint32_t cols, uint32_t *row, uint32_t *group) {
    uint32_t ng = cols / 32;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t g = 0; g < ng; g++)
            if (data[((uint64_t)r * ng + g) * 17] == 255) { *row = r; *group = g; return 1; }
    return 0;
}
