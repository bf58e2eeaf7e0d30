/* test_sampler.c — the sampler's selection (top_k by radix select, the full order by radix
 * sort, no comparison sort) draws exactly what a plain qsort of the vocabulary draws
 * (docs/ENGINE.md §2 Sampling): the reference below is the straightforward algorithm —
 * sort every (value, id) pair descending with ties to the lower id, cut at top_k, weights,
 * top_p prefix, renormalise, walk to u — run on the same logits and seeds. Vectors mix
 * ties, equal runs, -inf, NaN, huge and tiny spreads and vocabularies from 1 to 70,000.
 * Like test_kernels it reaches internal functions (src/engine.h, linked from libwaste.a):
 * the draw order is a property of the implementation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static int failures;
#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)(rng >> 32); }
static double rndu(void) { return (double)rnd() / 4294967296.0; }

/* ==== the reference: sort everything ============================================== */
static int by_value_desc(const void *a, const void *b) {
    const struct ws_pair *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static int32_t reference(struct ws_pair *ps, const float *logits, uint32_t n, const waste_gen_params *p, ws_rng *r) {
    float mx = logits[0];
    for (uint32_t i = 1; i < n; i++) if (logits[i] > mx) mx = logits[i];
    if (p->temperature <= 0.0f) {
        int32_t tok = 0;
        for (uint32_t i = 1; i < n; i++) if (logits[i] > logits[tok]) tok = (int32_t)i;
        return tok;
    }
    double t = (double)p->temperature;
    for (uint32_t i = 0; i < n; i++) {
        double v = ((double)logits[i] - (double)mx) / t;
        ps[i].v = v == v ? v : -INFINITY;
        if (p->min_p > 0.0f && !(exp(ps[i].v) >= (double)p->min_p)) ps[i].v = -INFINITY;   /* p_i/p_max < min_p */
        ps[i].id = (int32_t)i; ps[i].pad = 0;
    }
    qsort(ps, n, sizeof *ps, by_value_desc);
    uint32_t m = n;
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    while (m > 1 && ps[m - 1].v == -INFINITY) m--;   /* weight 0: never kept */
    double sum = 0.0;
    for (uint32_t i = 0; i < m; i++) { ps[i].v = wn_exp(ps[i].v); sum += ps[i].v; }
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
    return ps[m - 1].id;
}

/* ==== logit vectors ================================================================ */
static void fill(float *l, uint32_t n, int kind) {
    double spread = kind % 3 == 0 ? 1.0 : kind % 3 == 1 ? 30.0 : 1e6;
    for (uint32_t i = 0; i < n; i++) l[i] = (float)((rndu() - 0.5) * spread);
    switch (kind % 7) {
    case 1:   /* few distinct values: long runs of exact ties */
        for (uint32_t i = 0; i < n; i++) l[i] = (float)(rnd() % 5);
        break;
    case 2:   /* every value equal */
        for (uint32_t i = 0; i < n; i++) l[i] = 2.5f;
        break;
    case 3:   /* -inf and NaN sprinkled in (damaged weights), a tie at the top */
        for (uint32_t i = 0; i < n; i++) if (rnd() % 7 == 0) l[i] = rnd() % 2 ? -INFINITY : NAN;
        if (n > 3) { l[1] = 40.0f; l[n - 1] = 40.0f; }
        break;
    case 4:   /* one dominant logit */
        l[rnd() % n] = 1e4f;
        break;
    case 5:   /* values a few ulps apart */
        for (uint32_t i = 0; i < n; i++) l[i] = nextafterf(1.0f, 2.0f) * (1.0f + (float)(rnd() % 8) * 1.2e-7f);
        break;
    default:
        break;
    }
}

/* ==== logit processing against its formulas (docs/ENGINE.md §2 Logit processing) ===== */
static void test_processing(void) {
    enum { N = 70 };
    float l[N], want[N];
    uint32_t counts[N] = {0};
    uint8_t seen[N] = {0};
    for (int j = 0; j < N; j++) l[j] = (float)((j * 37) % 23) * 0.25f - 2.5f;
    memcpy(want, l, sizeof l);
    waste_gen_params gp; waste_gen_params_init(&gp);
    /* defaults: nothing written, even with the arrays present */
    ws_adjust(l, N, &gp, counts, seen, NULL);
    CHECK(memcmp(l, want, sizeof l) == 0);
    /* logit bias (OpenAI): added to the logit */
    int32_t bias_ids[3] = {4, 9, 4};
    float bias[3] = {100.0f, -100.0f, 1.5f};
    gp.n_logit_bias = 3; gp.logit_bias_ids = bias_ids; gp.logit_bias = bias;
    /* penalties: c[j] generated counts; seen[j] in the context */
    counts[1] = 3; counts[2] = 1; counts[4] = 2; seen[5] = 1; seen[2] = 1; seen[6] = 1;
    gp.presence_penalty = 0.5f; gp.frequency_penalty = 0.25f; gp.repetition_penalty = 1.3f;
    uint32_t allowed[3] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0x3Fu};
    allowed[0] &= ~(1u << 7); allowed[1] &= ~(1u << 1);   /* ids 7 and 33 masked */
    for (int j = 0; j < N; j++) {
        double v = want[j];
        for (int i = 0; i < 3; i++) if (bias_ids[i] == j) v = (float)(v + bias[i]);
        if (seen[j] || counts[j]) v = v > 0 ? (float)(v / 1.3f) : (float)(v * 1.3f);   /* vLLM repetition */
        v = (float)(v - 0.25f * (float)counts[j]);   /* OpenAI: - c * frequency */
        if (counts[j]) v = (float)(v - 0.5f);        /* - (c > 0) * presence */
        if (j == 7 || j == 33) v = -INFINITY;
        want[j] = (float)v;
    }
    ws_adjust(l, N, &gp, counts, seen, allowed);
    for (int j = 0; j < N; j++) {
        if (l[j] != want[j]) printf("id %d: got %.9g want %.9g\n", j, (double)l[j], (double)want[j]);
        CHECK(l[j] == want[j]);
    }
    CHECK(l[4] > 70.0f && l[9] < -70.0f);   /* (101.5 / 1.3) - 2 * 0.25 - 0.5 and -100 + ... */
    /* top logprobs: a full log-softmax, sorted, against ws_top */
    double mx = -INFINITY, z = 0.0;
    for (int j = 0; j < N; j++) if (l[j] > mx) mx = l[j];
    for (int j = 0; j < N; j++) z += exp((double)l[j] - mx);
    int32_t ids[20]; float lps[20];
    uint32_t got = ws_top(l, N, 20, ids, lps);
    CHECK(got == 20);
    for (uint32_t i = 0; i < got; i++) {
        double lp = (double)l[ids[i]] - mx - log(z);
        CHECK(fabs(lp - (double)lps[i]) < 1e-6);
        CHECK(ids[i] != 7 && ids[i] != 33);
        if (i) CHECK(l[ids[i - 1]] > l[ids[i]] || (l[ids[i - 1]] == l[ids[i]] && ids[i - 1] < ids[i]));
        /* nothing outside the list is larger than its last */
    }
    for (int j = 0; j < N; j++) {
        int in = 0;
        for (uint32_t i = 0; i < got; i++) in |= ids[i] == j;
        if (!in) CHECK(l[j] < l[ids[got - 1]] || (l[j] == l[ids[got - 1]] && j > ids[got - 1]));
    }
    CHECK(ids[0] == 4);
    /* with -inf everywhere but two ids, only those two are listed */
    float two[5] = {-INFINITY, 1.0f, -INFINITY, 1.0f, NAN};
    CHECK(ws_top(two, 5, 4, ids, lps) == 2 && ids[0] == 1 && ids[1] == 3);
    CHECK(fabs((double)lps[0] - log(0.5)) < 1e-6);
    /* a masked id is never drawn, and the draw's logprob is over the allowed ids only */
    struct ws_pair work[2 * N];
    waste_gen_params hot; waste_gen_params_init(&hot);
    hot.temperature = 5.0f;
    for (int s = 0; s < 2000; s++) {
        ws_rng r; ws_seed(&r, (uint64_t)s);
        float lp;
        int32_t tok = ws_sample(work, l, N, &hot, &r, &lp);
        CHECK(tok != 7 && tok != 33);
    }
}

int main(void) {
    test_processing();
    static const uint32_t sizes[] = {1, 2, 3, 7, 64, 500, 2049, 70000};
    static const float temps[] = {0.0f, 1e-30f, 0.3f, 1.0f, 1.7f, 1e6f};
    static const uint32_t top_ks[] = {0, 1, 2, 5, 40, 2048, 100000};
    static const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f, 1e-9f};
    uint32_t nmax = 70000;
    float *logits = malloc(nmax * sizeof *logits);
    struct ws_pair *ref = malloc(nmax * sizeof *ref), *work = malloc(2 * nmax * sizeof *work);
    if (!logits || !ref || !work) { printf("FAIL: out of memory\n"); return 1; }
    uint64_t cases = 0, differ_from_greedy = 0;
    for (unsigned si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        uint32_t n = sizes[si];
        int vectors = n >= 70000 ? 2 : n >= 2049 ? 7 : 21;
        for (int vec = 0; vec < vectors; vec++) {
            fill(logits, n, vec);
            for (unsigned ti = 0; ti < sizeof temps / sizeof temps[0]; ti++)
                for (unsigned ki = 0; ki < sizeof top_ks / sizeof top_ks[0]; ki++)
                    for (unsigned pi = 0; pi < sizeof top_ps / sizeof top_ps[0]; pi++) {
                        waste_gen_params gp; waste_gen_params_init(&gp);
                        gp.temperature = temps[ti]; gp.top_k = top_ks[ki]; gp.top_p = top_ps[pi];
                        int seeds = n >= 70000 ? 1 : 3;
                        for (int s = 0; s < seeds; s++) {
                            gp.min_p = s == 1 ? 0.05f : s == 2 && vec % 2 ? 0.9f : 0.0f;
                            gp.seed = (uint64_t)rnd() << 32 | rnd();
                            ws_rng r1, r2; ws_seed(&r1, gp.seed); ws_seed(&r2, gp.seed);
                            int32_t want = reference(ref, logits, n, &gp, &r1);
                            float lp;
                            int32_t got = ws_sample(work, logits, n, &gp, &r2, &lp);
                            /* several draws from one generator: the state after each matches too */
                            int32_t want2 = reference(ref, logits, n, &gp, &r1);
                            int32_t got2 = ws_sample(work, logits, n, &gp, &r2, &lp);
                            if (got != want || got2 != want2)
                                printf("n=%u vec %d T=%g top_k=%u top_p=%g seed %llu: got %d,%d want %d,%d\n", n, vec,
                                       (double)gp.temperature, gp.top_k, (double)gp.top_p,
                                       (unsigned long long)gp.seed, got, got2, want, want2);
                            CHECK(got == want && got2 == want2);
                            differ_from_greedy += want != 0 && n > 1;
                            cases++;
                        }
                    }
        }
    }
    /* The vectors exercise the sampler (not only trivial draws). */
    CHECK(differ_from_greedy > cases / 4);
    free(logits); free(ref); free(work);
    printf("test_sampler: %llu cases (%llu drew a nonzero id), %s\n", (unsigned long long)cases,
           (unsigned long long)differ_from_greedy, failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
