/* test_readahead.c — reader threads and lookahead (docs/ENGINE.md §5 Reading ahead) change
 * no logit: the testkit container at its floor budget (2·k slots, so every layer evicts and
 * guesses compete with real misses for slots) and with room for every expert, decoded token
 * by token and prefilled in one chunk, with 0 vs 1/3 readers and lookahead off/on; the
 * statistics add up (reads = misses − confirmed guesses + guesses; the one MoE layer leaves
 * lookahead only its second guess). Run under ASan/UBSan by
 * make test-asan, which also checks the threads' memory use. */
#include "testkit.h"

#define N_TOK 24
#define VOCAB 272

static int run(const char *dir, uint64_t budget, uint32_t io, uint32_t la, float *out, waste_stats *st) {
    waste_cfg cfg; waste_cfg_init(&cfg);
    cfg.usage_path = ""; cfg.n_threads = 1; cfg.ram_budget_bytes = budget; cfg.io_threads = io; cfg.lookahead = la;
    waste_ctx *ctx = tk_open(dir, &cfg);
    if (!ctx) return -1;
    int32_t ids[N_TOK];
    for (int i = 0; i < N_TOK; i++) ids[i] = 3 + (i * 37) % 250;
    int bad = 0;
    for (int i = 0; i < N_TOK && !bad; i++) bad |= waste_eval(ctx, &ids[i], 1, out + (uint64_t)i * VOCAB, VOCAB) != WASTE_OK;
    waste_reset(ctx);
    bad |= waste_eval(ctx, ids, N_TOK, out + (uint64_t)N_TOK * VOCAB, VOCAB) != WASTE_OK;
    waste_stats_init(st);
    bad |= waste_get_stats(ctx, st) != WASTE_OK;
    if (bad) printf("eval failed: %s\n", waste_last_error(ctx));
    waste_close(ctx);
    return bad ? -1 : 0;
}

int main(void) {
    char dir[] = "/tmp/waste-readahead-XXXXXX";
    if (!mkdtemp(dir) || tk_write_container(dir)) { printf("FAIL: cannot write the container\n"); return 1; }
    waste_cfg cfg; waste_cfg_init(&cfg); cfg.usage_path = "";
    waste_plan plan; waste_plan_init(&plan);
    char err[512];
    CHECK(waste_plan_memory(dir, &cfg, &plan, err, sizeof err) == WASTE_OK);
    static float ref[(N_TOK + 1) * VOCAB], got[(N_TOK + 1) * VOCAB];
    uint64_t budgets[2] = {plan.floor_bytes, 0};
    for (int b = 0; b < 2; b++) {
        waste_stats s0, s;
        CHECK(run(dir, budgets[b], 0, 0, ref, &s0) == 0);
        CHECK(s0.guesses == 0 && s0.io_threads == 0);
        static const uint32_t cases[][2] = {{1, 0}, {3, 0}, {1, 1}, {3, 1}};
        for (int c = 0; c < 4; c++) {
            memset(got, 0, sizeof got);
            CHECK(run(dir, budgets[b], cases[c][0], cases[c][1], got, &s) == 0);
            if (memcmp(ref, got, sizeof ref) != 0)
                printf("budget %d io %u lookahead %u: logits differ\n", b, cases[c][0], cases[c][1]);
            CHECK(memcmp(ref, got, sizeof ref) == 0);
            CHECK(s.io_threads == cases[c][0] && s.lookahead == cases[c][1]);
            CHECK(s.reads == s.misses - s.guess_hits + s.guesses);
            CHECK(s.misses + s.hits == s0.misses + s0.hits);   /* the same accesses */
            if (b == 0) CHECK(s.misses > 0 && s.queue_depth_max >= 1 && s.disk_busy_s > 0);
            /* One MoE layer: no next layer to guess (a guess never crosses into the next
             * token), so every guess is the second one, made before the layer's mixer; each
             * token's reads have all landed by then, so its readers are idle and it guesses
             * whenever the cache lacks a guessed expert (at the floor budget, every token).
             * tests/engine/test_invariants.py covers guesses on four MoE layers. */
            if (!cases[c][1]) CHECK(s.guesses == 0 && s.wasted_bytes == 0);
            else if (b == 0) CHECK(s.guesses > 0 && s.guess_hits > 0);
        }
    }
    tk_remove_container(dir);
    printf("test_readahead: %s\n", tk_failures ? "FAILED" : "ok");
    return tk_failures ? 1 : 0;
}
