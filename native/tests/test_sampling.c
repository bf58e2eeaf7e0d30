/* test_sampling.c — docs/ENGINE.md §2 Sampling through waste_generate on a testkit container:
 * any finite T > 0 is well defined (a tiny T equals greedy), and exact ties go to the
 * lower id, for greedy and for sampling (checked draw by draw against xoshiro256**). */
#include <math.h>

#include "testkit.h"

/* ==== the generator of docs/ENGINE.md §2, for the expected draws =================== */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static double first_uniform(uint64_t seed) {
    uint64_t s[4], x = seed;
    for (int i = 0; i < 4; i++) s[i] = splitmix64(&x);
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    return (double)(out >> 11) * (1.0 / 9007199254740992.0);
}

static int32_t last_token;
static int32_t on_token(const waste_token_info *info, void *user) { (void)user; last_token = info->token; return 0; }

/* The first sampled token after `prompt` (reset first). */
static int32_t first_token(waste_ctx *ctx, const int32_t *prompt, uint32_t n, float temperature, uint32_t top_k,
                           float top_p, uint64_t seed) {
    waste_reset(ctx);
    waste_gen_params gp; waste_gen_params_init(&gp);
    gp.temperature = temperature; gp.top_k = top_k; gp.top_p = top_p; gp.seed = seed; gp.max_tokens = 1;
    waste_gen_result res; waste_gen_result_init(&res);
    last_token = -1;
    int32_t st = waste_generate(ctx, prompt, n, &gp, on_token, NULL, &res);
    if (st != WASTE_OK) { printf("generate: %s: %s\n", waste_status_name(st), waste_last_error(ctx)); return -2; }
    return last_token;
}

static void tiny_temperature_is_greedy(const char *dir) {
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    static const float temps[] = {1e-45f, 1e-40f, 1e-37f, 1e-30f, 1e-20f};
    for (int32_t p = 0; p < 24; p++) {
        int32_t prompt[3] = {3 + 11 * p, 7, 100 + p};
        int32_t greedy = first_token(ctx, prompt, 3, 0.0f, 0, 1.0f, 0);
        CHECK(greedy >= 0);
        for (unsigned k = 0; k < sizeof temps / sizeof temps[0]; k++)
            for (uint64_t seed = 0; seed < 3; seed++) {
                int32_t got = first_token(ctx, prompt, 3, temps[k], 0, 1.0f, seed);
                if (got != greedy) printf("prompt %d T=%g seed %llu: %d, greedy %d\n", p, temps[k], (unsigned long long)seed, got, greedy);
                CHECK(got == greedy);
            }
    }
    waste_close(ctx);
}

/* Makes lm_head rows a < b equal (and positive at `prompt`), every other row zero: the
 * logits are then exactly s, s at a and b and exactly 0 elsewhere. Returns s. */
static float make_tie(const char *dir, int32_t a, int32_t b, const int32_t *prompt, uint32_t n) {
    long long off = tk_tensor_offset(dir, "lm_head");
    uint64_t size = 0;
    char *trunk = tk_read_file(dir, "trunk.bin", &size);
    if (off < 0 || !trunk) { free(trunk); return NAN; }
    float *rows = (float *)(trunk + off), row[TK_H];
    memcpy(row, rows + 3 * TK_H, sizeof row);
    float s = 0;
    for (int sign = 1; sign >= -1; sign -= 2) {
        for (int i = 0; i < TK_V * TK_H; i++) rows[i] = 0.0f;
        for (int j = 0; j < TK_H; j++) rows[a * TK_H + j] = rows[b * TK_H + j] = 4.0f * (float)sign * row[j];
        tk_patch_file(dir, "trunk.bin", off, rows, 4ull * TK_V * TK_H);
        waste_ctx *ctx = tk_open(dir, NULL);
        float logits[TK_V];
        if (!ctx || waste_eval(ctx, prompt, n, logits, TK_V) != WASTE_OK) { waste_close(ctx); break; }
        waste_close(ctx);
        s = logits[a];
        int exact = logits[b] == s;
        for (int i = 0; i < TK_V; i++) if (i != a && i != b && logits[i] != 0.0f) exact = 0;
        if (!exact) { s = NAN; break; }
        if (s > 0) break;
    }
    free(trunk);
    return s;
}

static void ties_go_to_the_lower_id(const char *dir) {
    const int32_t a = 7, b = 9, prompt[3] = {40, 41, 42};
    float s = make_tie(dir, a, b, prompt, 3);
    CHECK(s > 0.0f);
    if (!(s > 0.0f)) return;
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    CHECK(first_token(ctx, prompt, 3, 0.0f, 0, 1.0f, 0) == a);                 /* greedy */
    int seen_a = 0, seen_b = 0;
    for (uint64_t seed = 0; seed < 64; seed++) {
        CHECK(first_token(ctx, prompt, 3, 1.0f, 1, 1.0f, seed) == a);          /* top_k 1 keeps the lower id */
        CHECK(first_token(ctx, prompt, 3, 1e-40f, 0, 1.0f, seed) != -2);
        /* top_k 2 keeps {a, b} in id order with mass 1/2 each: u < 1/2 draws a. */
        int32_t want = first_uniform(seed) < 0.5 ? a : b, got = first_token(ctx, prompt, 3, 0.7f, 2, 1.0f, seed);
        CHECK(got == want);
        seen_a += got == a; seen_b += got == b;
        /* top_p 0.5: the shortest prefix with mass >= 1/2 is {a} alone. */
        CHECK(first_token(ctx, prompt, 3, 1e-30f, 0, 0.5f, seed) == a);
    }
    CHECK(seen_a > 0 && seen_b > 0);
    /* The 0 logits tie too: at T = 1e30 every weight is exactly 1 and top_k 3 keeps a, b and
     * then the lowest id of the zeros, 0, in that order, a third each. */
    for (uint64_t seed = 0; seed < 32; seed++) {
        double u = first_uniform(seed);
        int32_t want = u < 1.0 / 3 ? a : u < 2.0 / 3 ? b : 0;
        CHECK(first_token(ctx, prompt, 3, 1e30f, 3, 1.0f, seed) == want);
    }
    waste_close(ctx);
}

int main(void) {
    char dir[] = "/tmp/waste-sampling-XXXXXX";
    if (!mkdtemp(dir) || tk_write_container(dir)) { printf("FAIL: cannot write the container\n"); return 1; }
    tiny_temperature_is_greedy(dir);
    ties_go_to_the_lower_id(dir);
    tk_remove_container(dir);
    if (tk_failures) { printf("test_sampling: %d failure(s)\n", tk_failures); return 1; }
    printf("test_sampling: ok\n");
    return 0;
}
