/* fuzz_manifest.c — libFuzzer target for the manifest reader (container.c, model.c).
 *
 * The input is a whole manifest.json, written into a temporary container whose data
 * files are real (tests/testkit.h: trunk.bin, one expert bank, the tokenizer files), so
 * a manifest that validates gets opened and used the way a host uses it: model info,
 * eval, generate, a snapshot round trip, a segment chain, markup tokenize. Plan and open must return a
 * known status with a detail naming what is wrong, never crash, leak or read out of
 * bounds. The last input byte picks cfg.verify (and the seed), so both paths run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/testkit.h"
#include "fuzzkit.h"


static char dir[64];

static void make_dir(void) { fuzz_make_dir(dir, sizeof dir, "fuzzman"); }

static void cleanup(void) { tk_remove_container(dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    make_dir();
    REQUIRE(tk_write_container(dir) == 0);
    atexit(cleanup);
    return 0;
}

static uint64_t rng;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static void exercise(waste_ctx *ctx) {
    waste_model_info info; waste_model_info_init(&info);
    REQUIRE(waste_get_model_info(ctx, &info) == WASTE_OK && info.vocab > 0);
    int32_t ids[8];
    for (int i = 0; i < 8; i++) ids[i] = (int32_t)(next() % info.vocab);
    float *logits = malloc(4ull * info.vocab);
    int32_t st = waste_eval(ctx, ids, 8, logits, info.vocab);
    REQUIRE(st == WASTE_OK || waste_last_error(ctx)[0]);
    waste_reset(ctx);
    waste_gen_params gp; waste_gen_params_init(&gp);
    gp.max_tokens = 3; gp.temperature = 0.8f; gp.seed = next();
    waste_gen_result res; waste_gen_result_init(&res);
    st = waste_generate(ctx, ids, 3, &gp, NULL, NULL, &res);
    REQUIRE(st == WASTE_OK || waste_last_error(ctx)[0]);
    uint64_t size = 0, got = 0;
    if (waste_snapshot_size(ctx, &size) == WASTE_OK) {
        void *snap = malloc(size ? size : 1);
        if (waste_snapshot_save(ctx, snap, size, &got) == WASTE_OK) {
            st = waste_snapshot_load(ctx, snap, got);
            REQUIRE(st == WASTE_OK || st == WASTE_E_STATE);
        }
        free(snap);
    }
    REQUIRE(tk_segment_chain_round_trip(ctx, ids + 3) == WASTE_OK);
    int32_t toks[64]; uint64_t nt = 0;
    waste_tokenize_markup(ctx, "hello <|im_end|> world \xc3\xa9", 25, info.bos_id >= 0, toks, 64, &nt);
    waste_stats stats; waste_stats_init(&stats);
    REQUIRE(waste_get_stats(ctx, &stats) == WASTE_OK);
    free(logits);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (tk_write_file(dir, "manifest.json", data, size) != 0) abort();
    uint8_t last = size ? data[size - 1] : 0;
    rng = 0x9E3779B97F4A7C15ull ^ last;
    char err[512];
    waste_plan plan; waste_plan_init(&plan);
    waste_cfg cfg; waste_cfg_init(&cfg);
    cfg.usage_path = ""; cfg.ctx_tokens = 64; cfg.n_threads = 1; cfg.verify = last & 1;
    cfg.ram_budget_bytes = 0;
    err[0] = 0;
    int32_t st = waste_plan_memory(dir, &cfg, &plan, err, sizeof err);
    REQUIRE(st <= 0 && st >= -11);
    REQUIRE(st == WASTE_OK || err[0]);
    waste_ctx *ctx = NULL;
    err[0] = 0;
    int32_t st2 = waste_open(dir, &cfg, &ctx, err, sizeof err);
    REQUIRE(st2 <= 0 && st2 >= -11);
    if (st2 != WASTE_OK) { REQUIRE(ctx == NULL && err[0]); return 0; }
    REQUIRE(ctx != NULL);
    exercise(ctx);
    waste_close(ctx);
    /* tokenizer_only reads the manifest and tokenizer only: it must agree that it is valid. */
    cfg.tokenizer_only = 1;
    REQUIRE(waste_open(dir, &cfg, &ctx, err, sizeof err) == WASTE_OK);
    waste_close(ctx);
    return 0;
}
