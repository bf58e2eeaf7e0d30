/* test_kernels.c — the int4 and mxfp4 weight formats (docs/FORMAT.md §2) at the kernel
 * level: the decode tables (E2M1 magnitudes with the sign on bit 3, E8M0 = 2^(e−127)), the
 * byte layout of a row (low nibble = even column), that every dot kernel equals the
 * lane-striped f32 dot of the decoded row, and that the generic, AVX2 and AVX-512 kernel
 * sets give the same bits. Like test_numerics it reaches internal functions (src/internal.h,
 * linked from libwaste.a): bit-identity is a property of the implementation. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int failures;
#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)(rng >> 32); }
static float rndf(void) { return (float)((int32_t)(rnd() >> 8) - (1 << 23)) / (float)(1 << 23); }
static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* The kernel sets every check runs: generic first (the reference the others must equal),
 * then AVX2 and AVX-512, NULL where this CPU lacks them. main fills it. */
static const wk_kernels *sets[3];

/* n outputs of `set` against what the check expects, bit for bit. The first element that
 * differs is printed (the set, the case as the printf-style `what` names it, the index) and
 * counted as one failure; returns its index, n when all agree. */
__attribute__((format(printf, 5, 6)))
static uint32_t same_bits(const wk_kernels *set, const float *got, const float *want, uint32_t n, const char *what, ...) {
    for (uint32_t i = 0; i < n; i++)
        if (bits(got[i]) != bits(want[i])) {
            va_list ap;
            va_start(ap, what);
            printf("FAIL: %s ", set->name);
            vprintf(what, ap);
            printf(" [%u]: %a, expected %a\n", i, got[i], want[i]);
            va_end(ap);
            failures++;
            return i;
        }
    return n;
}

static void decode_tables(void) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int n = 0; n < 16; n++) {
        float want = (n & 8) ? -mag[n & 7] : mag[n & 7];
        CHECK(bits(wk_e2m1((uint8_t)n)) == bits(want));
        CHECK((float)wk_e2m1x2[n] == 2.0f * want);
    }
    for (int e = 0; e < 255; e++) {
        CHECK(wk_e8m0((uint8_t)e) == ldexpf(1.0f, e - 127));
        CHECK(wk_e8m0_half((uint8_t)e) == ldexpf(1.0f, e - 128));
        for (int n = 0; n < 16; n++)   /* the kernels' product is the table's product, in value */
            CHECK((float)wk_e2m1x2[n] * wk_e8m0_half((uint8_t)e) == wk_e2m1((uint8_t)n) * wk_e8m0((uint8_t)e));
    }
    CHECK(isnan(wk_e8m0(255)) && isnan(wk_e8m0_half(255)));
    CHECK(wk_e8m0(0) > 0.0f && wk_e8m0(0) < 1.1754944e-38f);   /* 2^−127 kept as a subnormal */
}

/* One int4 row of 64 columns, group 32, written by hand. */
static void int4_layout(void) {
    uint8_t row[2 * (2 + 16)];
    memset(row, 0, sizeof row);
    uint16_t s0 = 0x3800, s1 = 0x0001;   /* fp16 0.5 and the smallest subnormal 2^−24 */
    memcpy(row, &s0, 2); memcpy(row + 18, &s1, 2);
    row[2] = 0x9F;                        /* col 0: 15−8 = 7, col 1: 9−8 = 1 */
    row[3] = 0x08;                        /* col 2: 0, col 3: 0−8 = −8 */
    row[20] = 0x70;                       /* col 32: −8, col 33: −1 */
    wm_mat m = {WF_INT4, 32, 1, 64, wf_row_bytes(WF_INT4, 32, 64), row};
    CHECK(m.row_bytes == sizeof row);
    float out[64];
    wk_decode_row(&m, 0, out);
    CHECK(out[0] == 3.5f && out[1] == 0.5f && out[2] == 0.0f && out[3] == -4.0f && out[4] == -4.0f);
    CHECK(out[32] == -8.0f * ldexpf(1.0f, -24) && out[33] == -ldexpf(1.0f, -24) && out[34] == -8.0f * ldexpf(1.0f, -24));
}

/* One mxfp4 row of 64 columns: per group the E8M0 byte then 16 bytes, low nibble first. */
static void mxfp4_layout(void) {
    uint8_t row[2 * 17];
    memset(row, 0, sizeof row);
    row[0] = 128;                         /* scale 2 */
    row[1] = 0xF7;                        /* col 0: +6·2 = 12, col 1: −6·2 = −12 */
    row[2] = 0x19;                        /* col 2: −0.5·2 = −1, col 3: 0.5·2 = 1 */
    row[17] = 0;                          /* scale 2^−127 */
    row[18] = 0x05;                       /* col 32: 3·2^−127, col 33: 0 */
    wm_mat m = {WF_MXFP4, 32, 1, 64, wf_row_bytes(WF_MXFP4, 32, 64), row};
    CHECK(m.row_bytes == sizeof row);
    float out[64];
    wk_decode_row(&m, 0, out);
    CHECK(out[0] == 12.0f && out[1] == -12.0f && out[2] == -1.0f && out[3] == 1.0f && out[4] == 0.0f);
    CHECK(out[32] == 3.0f * ldexpf(1.0f, -127) && out[33] == 0.0f);
    uint32_t r = 99, g = 99;
    CHECK(!wk_mxfp4_find_nan_scale(row, 1, 64, &r, &g));
    row[17] = 255;
    CHECK(wk_mxfp4_find_nan_scale(row, 1, 64, &r, &g) && r == 0 && g == 1);
}

/* Random rows: every kernel set equals generic bit for bit, and generic equals the f32
 * lane-striped dot of the decoded row. Scales span fp16 subnormals and E8M0 0..160. */
static int kernel_sets_agree(void) {
    static const uint32_t ns[] = {32, 128, 256, 1408, 4096};
    int compared = 0;
    for (int f = 0; f < 3; f++) {
        int32_t fmt = f == 2 ? WF_MXFP4 : WF_INT4;
        uint32_t group = f == 1 ? 128 : 32;
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            uint32_t n = ns[k];
            if (n % group) continue;
            uint64_t rb = wf_row_bytes(fmt, group, n);
            uint8_t *row = malloc(rb);
            float *x = malloc(n * sizeof *x), *w = malloc(n * sizeof *w);
            for (int trial = 0; trial < 20; trial++) {
                for (uint64_t i = 0; i < rb; i++) row[i] = (uint8_t)rnd();
                for (uint32_t g = 0; g < n / group; g++) {
                    if (fmt == WF_MXFP4) {
                        uint8_t e = (uint8_t)(rnd() % 161);
                        if (trial == 0) e = (uint8_t)(g % 2);   /* the subnormal scales 2^−127, 2^−126 */
                        row[g * 17] = e;
                    } else {
                        uint16_t s = (uint16_t)(rnd() & 0x7BFF);   /* finite, any sign of exponent */
                        if (trial == 0) s = (uint16_t)(rnd() & 0x03FF);   /* fp16 subnormals */
                        memcpy(row + g * (2 + group / 2), &s, 2);
                    }
                }
                for (uint32_t i = 0; i < n; i++) x[i] = rndf();
                wm_mat m = {fmt, group, 1, n, rb, row};
                wk_decode_row(&m, 0, w);
                float ref = wk_dot_f32_generic(w, x, n);
                float gen = wk_dot_row(sets[0], &m, 0, x);
                CHECK(bits(gen) == bits(ref));
                for (int s = 1; s < 3; s++) {
                    if (!sets[s]) continue;
                    float got = wk_dot_row(sets[s], &m, 0, x);
                    if (bits(got) != bits(gen)) {
                        printf("FAIL: %s %s g%u n=%u trial %d: %a vs generic %a\n", sets[s]->name, wf_name(fmt), group, n,
                               trial, got, gen);
                        failures++;
                    }
                    compared++;
                }
            }
            free(row); free(x); free(w);
        }
    }
    return compared;
}

/* The KDA state rows of every set against the formula written out here, element by element
 * (a product rounded, then a sum rounded; volatile keeps the compiler from fusing them), on
 * lengths that leave SIMD tails, values spanning subnormals, and each set's own bits. */
static int kda_rows_agree(void) {
    static const uint32_t ns[] = {1, 7, 8, 15, 16, 17, 64, 128, 131};
    int compared = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        uint32_t n = ns[k];
        float s0[131], r0[131], dl[131], s[131], r[131], ws[131], wr[131];
        for (int trial = 0; trial < 20; trial++) {
            float scale = trial == 0 ? 0x1p-140f : 1.0f;   /* trial 0: subnormal products */
            for (uint32_t j = 0; j < n; j++) { s0[j] = rndf() * scale; r0[j] = rndf(); dl[j] = rndf(); }
            float e = 0.5f + 0.5f * rndf(), kk = rndf(), q = rndf();
            for (int op = 0; op < 2; op++) {
                for (uint32_t j = 0; j < n; j++) {   /* the formula */
                    volatile float p, t;
                    if (op == 0) { ws[j] = s0[j] * e; p = ws[j] * kk; wr[j] = r0[j] + p; }
                    else { p = kk * dl[j]; ws[j] = s0[j] + p; t = ws[j] * q; wr[j] = r0[j] + t; }
                }
                const char *kernel = op ? "update_read" : "decay_read";
                for (int si = 0; si < 3; si++) {
                    if (!sets[si]) continue;
                    memcpy(s, s0, n * sizeof *s); memcpy(r, r0, n * sizeof *r);
                    if (op == 0) sets[si]->decay_read(s, e, kk, r, n);
                    else sets[si]->update_read(s, kk, dl, q, r, n);
                    same_bits(sets[si], s, ws, n, "%s n=%u trial %d s", kernel, n, trial);
                    same_bits(sets[si], r, wr, n, "%s n=%u trial %d r", kernel, n, trial);
                    compared++;
                }
            }
        }
    }
    return compared;
}

enum { SCALES_DRAWN, SCALES_SUBNORMAL, SCALES_ANY_E8M0 };
static uint8_t *random_matrix(int32_t fmt, uint32_t group, uint32_t rows, uint32_t n, int scales);

/* The int8 row axpy of every set against the formula written out here (the weight, the
 * product, the sum, each rounded: volatile keeps them apart), on both int8 groups and on
 * subnormal scales. */
static int axpy_rows_agree(void) {
    static const uint32_t groups[] = {32, 128};   /* the int8 groups a container may have */
    int compared = 0;
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        uint32_t group = groups[gi], n = 768;   /* a multiple of either group */
        for (int trial = 0; trial < 6; trial++) {
            uint8_t *row = random_matrix(WF_INT8, group, 1, n, trial == 0 ? SCALES_SUBNORMAL : SCALES_DRAWN);
            float y0[768], want[768], got[768], a = rndf();
            for (uint32_t j = 0; j < n; j++) y0[j] = rndf();
            const uint8_t *p = row;
            for (uint32_t g0 = 0; g0 < n; g0 += group, p += 2 + group) {
                uint16_t sh; memcpy(&sh, p, 2);
                float sc = wu_fp16_to_f32(sh);
                for (uint32_t j = 0; j < group; j++) {
                    volatile float w = (float)((const int8_t *)(p + 2))[j] * sc, prod = a * w;
                    want[g0 + j] = y0[g0 + j] + prod;
                }
            }
            for (int si = 0; si < 3; si++) {
                if (!sets[si]) continue;
                memcpy(got, y0, n * sizeof *got);
                sets[si]->axpy_int8(row, a, got, n, group);
                same_bits(sets[si], got, want, n, "axpy_int8 g%u trial %d", group, trial);
                compared++;
            }
            free(row);
        }
    }
    return compared;
}

/* The f32 axpy of every set against the formula (the product, then the sum, each rounded:
 * volatile keeps them apart), on lengths with tails and on subnormal and huge values. */
static int axpy_f32_agrees(void) {
    enum { N = 531 };
    static float x[N], y0[N], want[N], got[N];
    int compared = 0;
    for (int trial = 0; trial < 12; trial++) {
        uint32_t n = N - (uint32_t)trial * 7;
        float a = trial == 0 ? 1e-30f : trial == 1 ? 3e30f : rndf();
        for (uint32_t j = 0; j < n; j++) {
            x[j] = trial == 2 ? rndf() * 1e-39f : rndf();
            y0[j] = rndf();
            volatile float p = a * x[j];
            want[j] = y0[j] + p;
        }
        for (int si = 0; si < 3; si++) {
            if (!sets[si]) continue;
            memcpy(got, y0, n * sizeof *got);
            sets[si]->axpy_f32(got, a, x, n);
            same_bits(sets[si], got, want, n, "axpy_f32 trial %d", trial);
            compared++;
        }
    }
    return compared;
}

/* exp_f32 of every set against wn_expf, bit for bit: the edges (NaN, ±inf, ±0, the overflow
 * and underflow limits, |x| = 700 where the SIMD lanes give way to wn_expf, subnormals) in
 * every lane position, then random floats over [-120, 120] and random bit patterns; lengths
 * that leave a tail. */
static int exp_agrees(void) {
    static const float edges[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 88.72283f, 88.72284f, -103.97208f, -87.33654f,
                                  -87.33655f, -745.2f, 709.8f, 700.0f, -700.0f, 700.00006f, -700.00006f, 1e-45f, -1e-45f,
                                  1e-38f, 0.5f, -0.5f, 0.34657359f, 3.4e38f, -3.4e38f, 1.0f, -1.0f};
    enum { N = 1027 };
    static float x[N], want[N], got[N];
    int compared = 0;
    for (int trial = 0; trial < 40; trial++) {
        uint32_t n = trial < 4 ? (uint32_t)(sizeof edges / sizeof edges[0]) + (uint32_t)trial : N - (uint32_t)(trial % 4);
        for (uint32_t i = 0; i < n; i++) {
            if (trial < 4) x[i] = edges[(i + (uint32_t)trial) % (sizeof edges / sizeof edges[0])];
            else if (trial % 2) x[i] = ((float)rnd() / 4294967296.0f - 0.5f) * 240.0f;
            else { uint32_t b = rnd(); memcpy(&x[i], &b, 4); }
        }
        for (uint32_t i = 0; i < n; i++) want[i] = wn_expf(x[i]);
        for (int si = 0; si < 3; si++) {
            if (!sets[si]) continue;
            sets[si]->exp_f32(x, got, n);
            uint32_t bad = same_bits(sets[si], got, want, n, "exp_f32 trial %d", trial);
            if (bad < n) printf("  (that is exp of x[%u] = %a)\n", bad, x[bad]);
            compared += (int)n;
        }
    }
    return compared;
}

/* quantize_q8 of every set against wk_quantize_q8, bit for bit (q and d): blocks of random
 * floats, of random bit patterns (NaN, ±inf, subnormals among them), all zero (±0), with a
 * subnormal maximum (127 / a overflows), with values on exact halves of a step (x·127/a =
 * k + 0.5, which round half to even decides), and one NaN or infinity in a finite block. */
static int quantize_agrees(void) {
    enum { NB = 64, N = NB * 32 };
    static float x[N], dw[NB], dg[NB];
    static int8_t qw[N], qg[N];
    int compared = 0;
    for (int trial = 0; trial < 30; trial++) {
        for (uint32_t b = 0; b < NB; b++) {
            float *xb = x + 32 * b;
            int kind = (int)((b + (uint32_t)trial) % 6);
            for (int i = 0; i < 32; i++) {
                if (kind == 0) xb[i] = rndf() * ldexpf(1.0f, (int)(rnd() % 40) - 20);
                else if (kind == 1) { uint32_t v = rnd(); memcpy(&xb[i], &v, 4); }
                else if (kind == 2) xb[i] = (rnd() & 1) ? -0.0f : 0.0f;
                else if (kind == 3) xb[i] = ldexpf(rndf(), -130 - (int)(rnd() % 16));
                else if (kind == 4) xb[i] = i == 0 ? 127.0f : (float)((int)(rnd() % 254) - 127) + 0.5f;
                else xb[i] = rndf();
            }
            if (kind == 5) xb[rnd() % 32] = (rnd() & 1) ? NAN : -INFINITY;
            if (kind == 5 && trial % 3 == 0) xb[rnd() % 32] = 3.0f;   /* sometimes finite again: the NaN stays */
        }
        wk_quantize_q8(x, N, qw, dw);
        for (int si = 0; si < 3; si++) {
            if (!sets[si]) continue;
            memset(qg, 0x55, sizeof qg);
            sets[si]->quantize_q8(x, N, qg, dg);
            for (uint32_t b = 0; b < NB; b++) {
                int same = memcmp(qg + 32 * b, qw + 32 * b, 32) == 0 && memcmp(&dg[b], &dw[b], 4) == 0;
                if (!same) {
                    printf("FAIL: %s quantize_q8 trial %d block %u: d %a vs generic %a\n", sets[si]->name, trial, b,
                           (double)dg[b], (double)dw[b]);
                    failures++;
                }
            }
            compared += NB;
        }
    }
    return compared;
}

/* A random quantized matrix of `rows` rows (scales as in kernel_sets_agree, int8 q any byte).
 * SCALES_ANY_E8M0 draws MXFP4 exponents from every byte (huge, overflowing and the NaN 255),
 * which the SIMD sets decode in registers rather than through wk_e8m0_half. */
static uint8_t *random_matrix(int32_t fmt, uint32_t group, uint32_t rows, uint32_t n, int scales) {
    const int subnormal = scales == SCALES_SUBNORMAL;
    uint64_t rb = wf_row_bytes(fmt, group, n);
    uint8_t *data = malloc(rb * rows);
    for (uint64_t i = 0; i < rb * rows; i++) data[i] = (uint8_t)rnd();
    uint32_t gcols = fmt == WF_MXFP4 ? 32 : group;
    uint64_t gbytes = fmt == WF_INT8 ? 2 + group : fmt == WF_INT4 ? 2 + group / 2 : 17;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t g = 0; g < n / gcols; g++) {
            uint8_t *p = data + r * rb + g * gbytes;
            if (fmt == WF_MXFP4) p[0] = subnormal ? (uint8_t)(g % 2) : scales == SCALES_ANY_E8M0 ? (uint8_t)rnd() : (uint8_t)(rnd() % 161);
            else {
                uint16_t sc = (uint16_t)(rnd() & (subnormal ? 0x03FF : 0x7BFF));
                memcpy(p, &sc, 2);
            }
        }
    return data;
}

/* The q8 activation path (WASTE_ACT_Q8): the quantizer's contract, every kernel set's rows_q8
 * equal to generic bit for bit (7 rows: one 4-row pass and 3 single rows), generic within the
 * quantization error of the exact f32 dot, and the f32 `rows` of every set equal to its dot. */
static int q8_path(void) {
    static const uint32_t ns[] = {32, 96, 128, 256, 1408, 4096};
    static const struct { int32_t fmt; uint32_t group; } fs[] = {
        {WF_INT8, 32}, {WF_INT8, 128}, {WF_INT4, 32}, {WF_INT4, 128}, {WF_MXFP4, 32}};
    enum { ROWS = 7 };
    int compared = 0;
    /* quantizer: q·d within d/2 of x, |q| <= 127, the block max exactly ±127; zero and
     * non-finite blocks */
    {
        float x[96]; int8_t q[96]; float d[3];
        for (int i = 0; i < 32; i++) x[i] = rndf();
        for (int i = 32; i < 64; i++) x[i] = 0.0f;
        for (int i = 64; i < 96; i++) x[i] = ldexpf(rndf(), -140);   /* subnormal maximum */
        x[5] = -1.5f;
        wk_quantize_q8(x, 96, q, d);
        CHECK(d[0] == 1.5f / 127.0f && q[5] == -127);
        for (int i = 0; i < 32; i++) CHECK(fabsf((float)q[i] * d[0] - x[i]) <= 0.5f * d[0] * 1.0001f);
        CHECK(d[1] == 0.0f);
        for (int i = 32; i < 64; i++) CHECK(q[i] == 0);
        for (int i = 64; i < 96; i++) CHECK(q[i] >= -127 && q[i] <= 127);
        x[70] = INFINITY;
        wk_quantize_q8(x, 96, q, d);
        CHECK(isnan(d[2]));
        x[70] = NAN;
        wk_quantize_q8(x, 96, q, d);
        CHECK(isnan(d[2]));
    }
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            uint32_t n = ns[k], group = fs[f].group;
            int32_t fmt = fs[f].fmt;
            if (n % group) continue;
            uint64_t rb = wf_row_bytes(fmt, group, n);
            float *x = malloc(n * sizeof *x), *w = malloc(n * sizeof *w), *xd = malloc(n / 32 * sizeof *xd);
            int8_t *xq = malloc(n);
            for (int trial = 0; trial < 6; trial++) {
                const int scales = trial == 0 ? SCALES_SUBNORMAL : trial == 2 ? SCALES_ANY_E8M0 : SCALES_DRAWN;
                uint8_t *data = random_matrix(fmt, group, ROWS, n, scales);
                for (uint32_t i = 0; i < n; i++) x[i] = trial == 1 && i < 32 ? 0.0f : rndf();
                wm_mat m = {fmt, group, ROWS, n, rb, data};
                wk_quantize_q8(x, n, xq, xd);
                float gen[ROWS], got[ROWS], y32[ROWS];
                sets[0]->rows_q8(&m, 0, ROWS, xq, xd, gen);
                /* within the quantization error: |Σ w (x − x̂)| <= Σ |w| d/2, plus f32 rounding
                 * (not with every E8M0 exponent, whose rows overflow: those only compare bits) */
                for (uint32_t r = 0; r < ROWS && !(scales == SCALES_ANY_E8M0 && fmt == WF_MXFP4); r++) {
                    wk_decode_row(&m, r, w);
                    double exact = 0.0, bound = 0.0;
                    for (uint32_t i = 0; i < n; i++) {
                        exact += (double)w[i] * x[i];
                        bound += fabs((double)w[i]) * (0.5 * xd[i / 32] + 1e-6 * fabs((double)x[i]));
                    }
                    if (!(fabs((double)gen[r] - exact) <= bound * 1.01 + 1e-30)) {
                        printf("FAIL: q8 %s g%u n=%u row %u: %g vs exact %g (bound %g)\n", wf_name(fmt), group, n, r,
                               (double)gen[r], exact, bound);
                        failures++;
                    }
                }
                for (int s = 0; s < 3; s++) {
                    if (!sets[s]) continue;
                    if (s) {
                        sets[s]->rows_q8(&m, 0, ROWS, xq, xd, got);
                        same_bits(sets[s], got, gen, ROWS, "q8 %s g%u n=%u trial %d vs generic, row", wf_name(fmt), group,
                                  n, trial);
                        compared += ROWS;
                    }
                    sets[s]->rows(&m, 0, ROWS, x, y32);
                    for (uint32_t r = 0; r < ROWS; r++) CHECK(bits(y32[r]) == bits(wk_dot_row(sets[s], &m, r, x)));
                    /* wk_matvec_rows: q8 only with xq */
                    wk_matvec_rows(sets[s], &m, 2, 5, x, NULL, NULL, got);
                    for (uint32_t r = 2; r < 5; r++) CHECK(bits(got[r]) == bits(y32[r]));
                    wk_matvec_rows(sets[s], &m, 2, 5, x, xq, xd, got);
                    for (uint32_t r = 2; r < 5; r++) CHECK(bits(got[r]) == bits(gen[r]));
                }
                free(data);
            }
            free(x); free(w); free(xd); free(xq);
        }
    }
    return compared;
}

int main(void) {
    sets[0] = wk_select(WASTE_KERNELS_GENERIC, NULL);
    sets[1] = wk_select(WASTE_KERNELS_AVX2, NULL);
    sets[2] = wk_select(WASTE_KERNELS_AVX512, NULL);
    decode_tables();
    int4_layout();
    mxfp4_layout();
    int compared = kernel_sets_agree();
    int compared_q8 = q8_path();
    printf("test_kernels: %d KDA state-row calls compared with the formula\n", kda_rows_agree());
    printf("test_kernels: %d int8 row axpy calls compared with the formula\n", axpy_rows_agree());
    printf("test_kernels: %d exp_f32 values compared with wn_expf\n", exp_agrees());
    printf("test_kernels: %d f32 axpy calls compared with the formula\n", axpy_f32_agrees());
    printf("test_kernels: %d q8 activation blocks compared with the generic quantizer\n", quantize_agrees());
    printf("test_kernels: %d q8 rows compared with generic\n", compared_q8);
    printf("test_kernels: int4/mxfp4 decode tables checked; %d SIMD dot products compared with generic (%s%s)\n", compared,
           sets[1] ? "avx2" : "no avx2", sets[2] ? ", avx512" : ", no avx512");
    if (failures) { printf("test_kernels: %d failure(s)\n", failures); return 1; }
    printf("test_kernels: ok\n");
    return 0;
}
