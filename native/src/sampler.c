/* sampler.c — token selection (engine.md §2 Sampling): argmax at T = 0; otherwise
 * logits/T → top_k → softmax (max subtracted) → top_p (sorted descending, shortest prefix
 * with mass ≥ p) → renormalise, then the first token whose cumulative mass exceeds u, with
 * u from xoshiro256** seeded by splitmix64(seed). Ties always go to the lower id. */
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

struct ws_pair { float v; int32_t id; };
_Static_assert(sizeof(struct ws_pair) == 8, "model.c allocates 8 bytes per pair");

/* Descending value, ties to the lower id: a total order, so qsort's result is unique. */
static int by_value_desc(const void *a, const void *b) {
    const struct ws_pair *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

int32_t ws_sample(waste_ctx *ctx, const float *logits, uint32_t n, const waste_gen_params *p, ws_rng *r, float *logprob) {
    /* log-softmax of the raw logits, for the reported logprob */
    float mx = logits[0];
    for (uint32_t i = 1; i < n; i++) if (logits[i] > mx) mx = logits[i];
    double z = 0.0;
    for (uint32_t i = 0; i < n; i++) z += wn_exp((double)(logits[i] - mx));
    double logz = wn_log(z);
    int32_t tok;
    if (p->temperature <= 0.0f) {
        tok = 0;
        for (uint32_t i = 1; i < n; i++) if (logits[i] > logits[tok]) tok = (int32_t)i;
    } else {
        struct ws_pair *ps = ctx->sample_pairs;
        for (uint32_t i = 0; i < n; i++) { ps[i].v = logits[i] / p->temperature; ps[i].id = (int32_t)i; }
        qsort(ps, n, sizeof *ps, by_value_desc);
        uint32_t m = n;
        if (p->top_k > 0 && p->top_k < m) m = p->top_k;
        float vmax = ps[0].v;
        double sum = 0.0;
        for (uint32_t i = 0; i < m; i++) sum += wn_exp((double)(ps[i].v - vmax));
        if (p->top_p < 1.0f) {
            double cum = 0.0;
            uint32_t keep = m;
            for (uint32_t i = 0; i < m; i++) {
                cum += wn_exp((double)(ps[i].v - vmax)) / sum;
                if (cum >= (double)p->top_p) { keep = i + 1; break; }
            }
            m = keep;
            sum = 0.0;
            for (uint32_t i = 0; i < m; i++) sum += wn_exp((double)(ps[i].v - vmax));
        }
        double u = ws_uniform(r), cum = 0.0;
        tok = ps[m - 1].id;
        for (uint32_t i = 0; i < m; i++) {
            cum += wn_exp((double)(ps[i].v - vmax)) / sum;
            if (cum > u) { tok = ps[i].id; break; }
        }
    }
    *logprob = (float)((double)(logits[tok] - mx) - logz);
    return tok;
}
