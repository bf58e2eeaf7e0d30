/* sampler.c — token selection (docs/ENGINE.md §2 Sampling): argmax at T = 0; otherwise
 * logits/T → top_k → softmax (max subtracted) → top_p (sorted descending, shortest prefix
 * with mass ≥ p) → renormalise, then the first token whose cumulative mass exceeds u, with
 * u from xoshiro256** seeded by splitmix64(seed). Ties always go to the lower id. The
 * arithmetic is in double and well defined for every finite T > 0 (sample_tempered).
 *
 * The sums run over the kept tokens in descending order (ties: lower id first), so that
 * order is part of the result. It is produced without a comparison sort of the vocabulary:
 * with top_k the k largest are selected in O(n) (a radix select on the value's bits) and
 * only those k are ordered; without top_k every weight enters the sums, so the whole
 * vocabulary is ordered by a stable LSD radix sort (O(n), no comparisons). Any correct
 * sort gives the same permutation (the order is total), so the draws are those of a plain
 * sort: native/tests/test_sampler.c checks that against qsort over many vectors and seeds.
 * The work area is ctx->sample_pairs, 2·vocab pairs allocated at open: nothing per token.
 *
 * Before that, ws_adjust processes the logits in place (logit bias, repetition, frequency
 * and presence penalties, the allowed-token mask) and min_p cuts after temperature; with the
 * defaults none of it touches a value. ws_top reports the most likely ids. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

_Static_assert(sizeof(struct ws_pair) == 16, "model.c allocates 16 bytes per pair");

/* ==== ordering by value without comparisons ======================================== */
/* Every v is (l - l_max)/T <= 0 (+0 at the max, -inf for a NaN logit), so descending v is
 * ascending |v|, and |v|'s bits (sign cleared) order like |v| itself: a 63-bit unsigned key.
 * +0 and -0 share a key, as they compare equal. */
static uint64_t key_of(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7FFFFFFFFFFFFFFFull;
}

#define RADIX_BITS 11
#define RADIX_SIZE (1u << RADIX_BITS)
#define RADIX_PASSES 6   /* 6 * 11 >= 63 key bits */

/* Stable LSD radix sort of a[0..n) by ascending key, using tmp[0..n); returns where the
 * result lives (a or tmp). Stable: equal keys keep their input order. A pass whose digit is
 * the same for every element is skipped. */
static struct ws_pair *radix_sort(struct ws_pair *a, struct ws_pair *tmp, uint32_t n) {
    uint32_t count[RADIX_SIZE];
    for (int pass = 0; pass < RADIX_PASSES; pass++) {
        int shift = pass * RADIX_BITS;
        memset(count, 0, sizeof count);
        for (uint32_t i = 0; i < n; i++) count[(key_of(a[i].v) >> shift) & (RADIX_SIZE - 1)]++;
        if (n == 0 || count[(key_of(a[0].v) >> shift) & (RADIX_SIZE - 1)] == n) continue;
        uint32_t sum = 0;
        for (uint32_t d = 0; d < RADIX_SIZE; d++) { uint32_t c = count[d]; count[d] = sum; sum += c; }
        for (uint32_t i = 0; i < n; i++) tmp[count[(key_of(a[i].v) >> shift) & (RADIX_SIZE - 1)]++] = a[i];
        struct ws_pair *t = a; a = tmp; tmp = t;
    }
    return a;
}

/* The k-th smallest key (1 <= k <= n) of a[0..n), digit by digit from the top (an MSD radix
 * select: each pass narrows the candidates to one bucket). */
static uint64_t kth_key(const struct ws_pair *a, uint32_t n, uint32_t k) {
    uint64_t prefix = 0, mask = 0;
    uint32_t count[RADIX_SIZE];
    for (int pass = RADIX_PASSES - 1; pass >= 0; pass--) {
        int shift = pass * RADIX_BITS;
        memset(count, 0, sizeof count);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t key = key_of(a[i].v);
            if ((key & mask) == prefix) count[(key >> shift) & (RADIX_SIZE - 1)]++;
        }
        uint32_t d = 0;
        while (count[d] < k) k -= count[d++];
        prefix |= (uint64_t)d << shift;
        mask |= (uint64_t)(RADIX_SIZE - 1) << shift;
    }
    return prefix;
}

/* Moves the k largest values of a[0..n) (ties: lower id) to the front of out[0..k), ordered
 * descending with ties to the lower id; a[] is in id order. Returns out (sorted in place,
 * using a as scratch) or a. */
static struct ws_pair *top_k_sorted(struct ws_pair *a, struct ws_pair *out, uint32_t n, uint32_t k) {
    uint64_t t = kth_key(a, n, k);
    uint32_t below = 0;
    for (uint32_t i = 0; i < n; i++) below += key_of(a[i].v) < t;
    uint32_t m = 0, ties = k - below;   /* the keys equal to t taken, lowest ids first */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t key = key_of(a[i].v);
        if (key < t || (key == t && ties && ties--)) out[m++] = a[i];
    }
    return radix_sort(out, a, k);
}

/* ==== selection ==================================================================== */
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
static int32_t sample_tempered(struct ws_pair *work, const float *logits, uint32_t n, float mx,
                               const waste_gen_params *p, ws_rng *r) {
    struct ws_pair *a = work, *b = work + n;
    double t = (double)p->temperature;
    for (uint32_t i = 0; i < n; i++) {
        double v = ((double)logits[i] - (double)mx) / t;
        a[i].v = v == v ? v : -INFINITY;   /* a NaN logit (damaged weights) gets weight 0; the order stays total */
        a[i].id = (int32_t)i; a[i].pad = 0;
    }
    if (p->min_p > 0.0f) {   /* vLLM's min_p: p_i / p_max = e^v_i >= min_p, else weight 0 */
        double floor_p = (double)p->min_p;
        for (uint32_t i = 0; i < n; i++) if (!(wn_exp(a[i].v) >= floor_p)) a[i].v = -INFINITY;
    }
    uint32_t m = n;
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    struct ws_pair *ps = m < n ? top_k_sorted(a, b, n, m) : radix_sort(a, b, n);
    /* -inf (masked, cut by min_p, NaN) sorts last and has weight 0: never kept, so that the
     * rounding fallback below cannot land on it. The max (v = 0) is always finite. */
    while (m > 1 && ps[m - 1].v == -INFINITY) m--;
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

int32_t ws_sample(struct ws_pair *work, const float *logits, uint32_t n, const waste_gen_params *p, ws_rng *r,
                  float *logprob) {
    float mx = logits[0];
    for (uint32_t i = 1; i < n; i++) if (logits[i] > mx) mx = logits[i];
    int32_t tok = p->temperature <= 0.0f ? argmax(logits, n) : sample_tempered(work, logits, n, mx, p, r);
    /* log-softmax of the raw logits at tok, for the reported logprob */
    double z = 0.0;
    for (uint32_t i = 0; i < n; i++) z += wn_exp((double)logits[i] - (double)mx);
    *logprob = (float)(((double)logits[tok] - (double)mx) - wn_log(z));
    return tok;
}

/* ==== logit processing ============================================================= */
void ws_adjust(float *logits, uint32_t n, const waste_gen_params *p, const uint32_t *counts,
               const uint8_t *seen, const uint32_t *allowed) {
    for (uint32_t i = 0; i < p->n_logit_bias; i++) logits[p->logit_bias_ids[i]] += p->logit_bias[i];
    if (seen && p->repetition_penalty != 1.0f) {
        float r = p->repetition_penalty;
        for (uint32_t j = 0; j < n; j++)
            if (seen[j] || (counts && counts[j])) {
                /* A tiny r (the API allows any r > 0) would overflow l / r to +inf and the
                 * log-softmax to NaN: saturate at the largest finite float. */
                float v = logits[j] > 0.0f ? logits[j] / r : logits[j] * r;
                logits[j] = v > FLT_MAX ? FLT_MAX : v;
            }
    }
    if (counts && (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f)) {
        for (uint32_t j = 0; j < n; j++) {
            if (!counts[j]) continue;
            logits[j] -= p->frequency_penalty * (float)counts[j];
            logits[j] -= p->presence_penalty;
        }
    }
    if (allowed)
        for (uint32_t j = 0; j < n; j++) if (!((allowed[j >> 5] >> (j & 31)) & 1u)) logits[j] = -INFINITY;
}

uint32_t ws_top(const float *logits, uint32_t n, uint32_t k, int32_t *ids, float *lps) {
    if (k > n) k = n;
    if (k == 0) return 0;
    float mx = logits[0];
    for (uint32_t i = 1; i < n; i++) if (logits[i] > mx) mx = logits[i];
    double z = 0.0;
    for (uint32_t i = 0; i < n; i++) if (logits[i] > -INFINITY) z += wn_exp((double)logits[i] - (double)mx);
    double lz = wn_log(z);   /* a NaN logit (damaged weights) has weight 0 here, as in the draw */
    /* insertion into a descending list of k: a later id enters only when strictly larger, so
     * ties keep the lower id first; a NaN never enters (comparisons with it are false) */
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (!(v > -INFINITY)) continue;   /* NaN and -inf (masked) are never listed */
        if (m == k && !(v > logits[ids[k - 1]])) continue;
        uint32_t at = m < k ? m++ : k - 1;
        while (at > 0 && v > logits[ids[at - 1]]) { ids[at] = ids[at - 1]; at--; }
        ids[at] = (int32_t)i;
    }
    for (uint32_t i = 0; i < m; i++) lps[i] = (float)(((double)logits[ids[i]] - (double)mx) - lz);
    return m;
}
