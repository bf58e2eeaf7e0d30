/* sampler.c — token selection (docs/ENGINE.md §2 Sampling): argmax at T = 0; otherwise
 * logits/T → top_k → softmax (max subtracted) → top_p (sorted descending, shortest prefix
 * with mass ≥ p) → renormalise, then the first token whose cumulative mass exceeds u, with
 * u from xoshiro256** seeded by splitmix64(seed). Ties always go to the lower id. The
 * arithmetic is in double and well defined for every finite T > 0 (sample_tempered). */
#include <math.h>
#include <stdlib.h>

#include "engine.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ws_seed(ws_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro(ws_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return out;
}

double ws_uniform(ws_rng *r) { return (double)(xoshiro(r) >> 11) * (1.0 / 9007199254740992.0); }

struct ws_pair { double v; int32_t id; int32_t pad; };
_Static_assert(sizeof(struct ws_pair) == 16, "model.c allocates 16 bytes per pair");

/* Descending value, ties to the lower id: a total order, so qsort's result is unique. */
static int by_value_desc(const void *a, const void *b) {
    const struct ws_pair *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* Index of the largest logit, the lowest id on ties. */
static int32_t argmax(const float *logits, uint32_t n) {
    int32_t tok = 0;
    for (uint32_t i = 1; i < n; i++) if (logits[i] > logits[tok]) tok = (int32_t)i;
    return tok;
}

/* v_i = (l_i - l_max) / T in double: the max maps to exactly 0 and every other value to a
 * finite v <= 0 for any finite T > 0 (|l_i - l_max| < 2^129 and T >= 2^-149 keep |v| below
 * 2^278), so no inf - inf and no NaN; this is logits/T with the softmax's max subtraction
 * done first. Then top_k, the weights e^v (the max has weight 1), top_p over the weights
 * sorted descending (the shortest prefix with mass >= p), renormalise, and the first token
 * whose cumulative mass exceeds u. */
static int32_t sample_tempered(waste_ctx *ctx, const float *logits, uint32_t n, float mx, const waste_gen_params *p,
                               ws_rng *r) {
    struct ws_pair *ps = ctx->sample_pairs;
    double t = (double)p->temperature;
    for (uint32_t i = 0; i < n; i++) {
        double v = ((double)logits[i] - (double)mx) / t;
        ps[i].v = v == v ? v : -INFINITY;   /* a NaN logit (damaged weights) gets weight 0; the order stays total */
        ps[i].id = (int32_t)i; ps[i].pad = 0;
    }
    qsort(ps, n, sizeof *ps, by_value_desc);
    uint32_t m = n;
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    double sum = 0.0;
    for (uint32_t i = 0; i < m; i++) { ps[i].v = wn_exp(ps[i].v); sum += ps[i].v; }   /* v -> weight */
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        uint32_t keep = m;
        for (uint32_t i = 0; i < m; i++) {
            cum += ps[i].v / sum;
            if (cum >= (double)p->top_p) { keep = i + 1; break; }
        }
        m = keep;
        sum = 0.0;
        for (uint32_t i = 0; i < m; i++) sum += ps[i].v;
    }
    double u = ws_uniform(r), cum = 0.0;
    for (uint32_t i = 0; i < m; i++) {
        cum += ps[i].v / sum;
        if (cum > u) return ps[i].id;
    }
    return ps[m - 1].id;   /* rounding left the total just below u: the last kept token */
}

int32_t ws_sample(waste_ctx *ctx, const float *logits, uint32_t n, const waste_gen_params *p, ws_rng *r, float *logprob) {
    float mx = logits[0];
    for (uint32_t i = 1; i < n; i++) if (logits[i] > mx) mx = logits[i];
    int32_t tok = p->temperature <= 0.0f ? argmax(logits, n) : sample_tempered(ctx, logits, n, mx, p, r);
    /* log-softmax of the raw logits at tok, for the reported logprob */
    double z = 0.0;
    for (uint32_t i = 0; i < n; i++) z += wn_exp((double)logits[i] - (double)mx);
    *logprob = (float)(((double)logits[tok] - (double)mx) - wn_log(z));
    return tok;
}
