/* test_numerics.c — the engine's own exp/log (src/numerics.c) against long double expl/logl
 * and against glibc, over dense sweeps; prints the maximum error in ulps and fails above
 * 1 ulp. The one C test that reaches an internal function (declared in src/internal.h,
 * linked from libwaste.a): accuracy is a property of the implementation, not of the API. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static double ulp_f32(long double ref) {
    float r = (float)ref;
    if (r == 0.0f || !isfinite(r)) return (double)nextafterf(0.0f, 1.0f);
    float up = nextafterf(fabsf(r), INFINITY);
    return (double)(up - fabsf(r));
}

static long double ulp_f64(long double ref) {
    double r = (double)ref;
    if (r == 0.0) return (long double)nextafter(0.0, 1.0);
    double a = fabs(r);
    return (long double)(nextafter(a, INFINITY) - a);
}

static float f32_of(uint32_t bits) { float f; memcpy(&f, &bits, 4); return f; }

typedef struct { double ours, libm; } errs;

/* f32: every stride-th bit pattern that lies in [lo, hi]. */
static errs sweep_f32(int is_exp, float lo, float hi, uint64_t stride) {
    errs e = {0, 0};
    for (uint64_t b = 0; b < 0x100000000ull; b += stride) {
        float x = f32_of((uint32_t)b);
        if (!(x >= lo && x <= hi)) continue;
        long double ref = is_exp ? expl((long double)x) : logl((long double)x);
        if (!isfinite((double)ref) || (float)ref == 0.0f || !isfinite((float)ref)) continue;
        double u = ulp_f32(ref);
        float ours = is_exp ? wn_expf(x) : wn_logf(x), lib = is_exp ? expf(x) : logf(x);
        double eo = (double)fabsl((long double)ours - ref) / u, el = (double)fabsl((long double)lib - ref) / u;
        if (eo > e.ours) e.ours = eo;
        if (el > e.libm) e.libm = el;
    }
    return e;
}

/* f64: n points spread over [lo, hi] with a multiplicative jitter (every exponent hit). */
static errs sweep_f64(int is_exp, double lo, double hi, uint64_t n) {
    errs e = {0, 0};
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (uint64_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        double t = (double)(s >> 11) / 9007199254740992.0, x;
        if (is_exp) x = lo + (hi - lo) * t;
        else x = pow(2.0, -1070.0 + 2093.0 * t) * (1.0 + (double)(i % 1024) / 1024.0);
        long double ref = is_exp ? expl((long double)x) : logl((long double)x);
        double r = (double)ref;
        if (!isfinite(r) || r == 0.0 || fabs(r) < 2.2250738585072014e-308) continue;
        long double u = ulp_f64(ref);
        double ours = is_exp ? wn_exp(x) : wn_log(x), lib = is_exp ? exp(x) : log(x);
        double eo = (double)(fabsl((long double)ours - ref) / u), el = (double)(fabsl((long double)lib - ref) / u);
        if (eo > e.ours) e.ours = eo;
        if (el > e.libm) e.libm = el;
    }
    return e;
}

/* `test_numerics dense` sweeps every f32 in range and 10^8 doubles (minutes); the default
 * (what `make test` runs) takes every 1021st f32 pattern and 10^6 doubles. */
int main(int argc, char **argv) {
    int failures = 0, dense = argc > 1 && !strcmp(argv[1], "dense");
    uint64_t stride = dense ? 1 : 1021, n64 = dense ? 100000000 : 1000000;
    errs ef = sweep_f32(1, -103.0f, 88.7f, stride), lf = sweep_f32(0, 1e-38f, 3.4e38f, stride);
    errs ed = sweep_f64(1, -708.0, 709.7, n64), ld = sweep_f64(0, 0, 0, n64);
    printf("test_numerics: max error in ulps vs long double (glibc in brackets), %s sweep: expf %.3f [%.3f], "
           "logf %.3f [%.3f], exp %.3f [%.3f], log %.3f [%.3f]\n", dense ? "dense" : "sampled", ef.ours, ef.libm,
           lf.ours, lf.libm, ed.ours, ed.libm, ld.ours, ld.libm);
    if (ef.ours > 1.0 || lf.ours > 1.0 || ed.ours > 1.0 || ld.ours > 1.0) { printf("FAIL: above 1 ulp\n"); failures++; }
    /* Special values. */
    if (wn_exp(0.0) != 1.0 || wn_log(1.0) != 0.0 || wn_exp(-1000.0) != 0.0 || !isinf(wn_exp(1000.0)) ||
        !isnan(wn_log(-1.0)) || !isinf(wn_log(0.0)) || wn_log(0.0) > 0 || !isnan(wn_exp(NAN)) || !isinf(wn_log(INFINITY)) ||
        wn_expf(-INFINITY) != 0.0f || !isinf(wn_expf(INFINITY))) {
        printf("FAIL: special values\n"); failures++;
    }
    return failures ? 1 : 0;
}
