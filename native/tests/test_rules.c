/* test_rules.c — the library rules of docs/ENGINE.md §1–§2 through the public header, on a
 * testkit container: every failing call leaves a detail; pieces + tail == detokenize when
 * the callback or an abort stops generation inside a multi-byte character; waste_close
 * during a call is a no-op; only waste_reset clears poison (snapshot_load refuses); an
 * E_NOMEM while making a piece poisons; every kernel set gives the same logits bytes. */
#include "testkit.h"

/* ==== realloc that can be told to fail (not under ASan, which owns the allocator) ==== */
#if !defined(__SANITIZE_ADDRESS__)
#define CAN_FAIL_REALLOC 1
extern void *__libc_realloc(void *p, size_t n);
static int fail_realloc;
void *realloc(void *p, size_t n) { return fail_realloc ? NULL : __libc_realloc(p, n); }
#endif

/* The last status's detail is empty before the call (reset succeeded) and not after. */
static int refused(waste_ctx *ctx, int32_t st, int32_t want, const char *needle, int line) {
    const char *d = waste_last_error(ctx);
    int ok = st == want && d && d[0] && (!needle || strstr(d, needle));
    if (!ok) printf("FAIL line %d: status %s (want %s), detail \"%s\"\n", line, waste_status_name(st), waste_status_name(want), d ? d : "(null)");
    return ok;
}
#define REFUSED(call, want, needle) do { CHECK(waste_reset(ctx) == WASTE_OK && waste_last_error(ctx)[0] == 0); \
                                         CHECK(refused(ctx, (call), (want), (needle), __LINE__)); } while (0)

static void every_refusal_has_a_detail(const char *dir) {
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    int32_t ids[8] = {3, 4, 5, 6, 7, 8, 9, 10}, out[64];
    char buf[64];
    float logits[TK_V];
    uint64_t n = 0;
    REFUSED(waste_tokenize(ctx, NULL, 5, 0, out, 64, &n), WASTE_E_ARG, "NULL");
    REFUSED(waste_tokenize(ctx, "a", 1, 0, NULL, 64, &n), WASTE_E_ARG, "NULL");
    REFUSED(waste_tokenize(ctx, "a", 1, 0, out, 64, NULL), WASTE_E_ARG, "NULL");
    REFUSED(waste_tokenize(ctx, "abc\xff", 4, 0, out, 64, &n), WASTE_E_ARG, "invalid UTF-8 at byte 3");
    REFUSED(waste_tokenize_markup(ctx, "[EOS]\xe4\xb8", 7, 0, out, 64, &n), WASTE_E_ARG, "invalid UTF-8 at byte 5");
    REFUSED(waste_tokenize(ctx, "\xed\xa0\x80", 3, 0, out, 64, &n), WASTE_E_ARG, "invalid UTF-8 at byte 0");   /* a surrogate */
    REFUSED(waste_tokenize(ctx, "hello world", 11, 0, out, 1, &n), WASTE_E_SPACE, "needed");
    REFUSED(waste_detokenize(ctx, (int32_t[]){TK_V - 1}, 1, buf, 64, &n), WASTE_E_ARG, "ids[0]");
    REFUSED(waste_detokenize(ctx, ids, 8, buf, 2, &n), WASTE_E_SPACE, "needed");
    REFUSED(waste_detokenize(ctx, ids, 8, buf, 64, NULL), WASTE_E_ARG, "NULL");
    REFUSED(waste_eval(ctx, NULL, 1, NULL, 0), WASTE_E_ARG, "n must be");
    REFUSED(waste_eval(ctx, ids, 0, NULL, 0), WASTE_E_ARG, "n must be");
    REFUSED(waste_eval(ctx, (int32_t[]){TK_V}, 1, NULL, 0), WASTE_E_ARG, "outside the vocabulary");
    REFUSED(waste_eval(ctx, ids, 1, logits, 3), WASTE_E_SPACE, "logits holds 3");
    waste_gen_params gp; waste_gen_params_init(&gp);
    waste_gen_result res; waste_gen_result_init(&res);
    REFUSED(waste_generate(ctx, ids, 2, NULL, NULL, NULL, &res), WASTE_E_ARG, "params");
    gp.struct_size = 4;
    REFUSED(waste_generate(ctx, ids, 2, &gp, NULL, NULL, &res), WASTE_E_ARG, "struct_size");
    waste_gen_params_init(&gp); res.struct_size = 4;
    REFUSED(waste_generate(ctx, ids, 2, &gp, NULL, NULL, &res), WASTE_E_ARG, "struct_size");
    waste_gen_result_init(&res); gp.temperature = -1.0f;
    REFUSED(waste_generate(ctx, ids, 2, &gp, NULL, NULL, &res), WASTE_E_ARG, "temperature");
    waste_gen_params_init(&gp); gp.top_p = 0.0f;
    REFUSED(waste_generate(ctx, ids, 2, &gp, NULL, NULL, &res), WASTE_E_ARG, "top_p");
    waste_gen_params_init(&gp); gp.n_stop_ids = 2;
    REFUSED(waste_generate(ctx, ids, 2, &gp, NULL, NULL, &res), WASTE_E_ARG, "stop_ids");
    waste_gen_params_init(&gp);
    REFUSED(waste_generate(ctx, ids, 0, &gp, NULL, NULL, &res), WASTE_E_ARG, "n must be");
    REFUSED(waste_snapshot_size(ctx, NULL), WASTE_E_ARG, "size");
    REFUSED(waste_snapshot_save(ctx, NULL, 0, NULL), WASTE_E_ARG, "n_out");
    REFUSED(waste_snapshot_save(ctx, buf, 4, &n), WASTE_E_SPACE, "snapshot needs");
    REFUSED(waste_snapshot_load(ctx, NULL, 0), WASTE_E_ARG, "buf");
    REFUSED(waste_snapshot_load(ctx, "garbage", 7), WASTE_E_FORMAT, "snapshot");
    waste_model_info info; waste_model_info_init(&info);
    REFUSED(waste_get_model_info(ctx, NULL), WASTE_E_ARG, "info");
    info.struct_size = 1;
    REFUSED(waste_get_model_info(ctx, &info), WASTE_E_ARG, "struct_size");
    waste_stats stats; waste_stats_init(&stats);
    REFUSED(waste_get_stats(ctx, NULL), WASTE_E_ARG, "stats");
    stats.struct_size = 1;
    REFUSED(waste_get_stats(ctx, &stats), WASTE_E_ARG, "struct_size");
    REFUSED(waste_save_usage(ctx, ""), WASTE_E_ARG, "empty");
    uint32_t n_pos;
    REFUSED(waste_image_add(ctx, "x", 1, 1, &n_pos), WASTE_E_UNSUPPORTED, "vision");
    REFUSED(waste_image_expand(ctx, ids, 1, out, 8, &n), WASTE_E_UNSUPPORTED, "vision");
    REFUSED(waste_image_clear(ctx), WASTE_E_UNSUPPORTED, "vision");
    waste_close(ctx);
    waste_cfg cfg; waste_cfg_init(&cfg);
    cfg.usage_path = ""; cfg.ctx_tokens = 4; cfg.n_threads = 1;
    ctx = tk_open(dir, &cfg);
    if (!ctx) { tk_failures++; return; }
    REFUSED(waste_eval(ctx, ids, 5, NULL, 0), WASTE_E_CTX, "ctx_tokens 4");
    REFUSED(waste_generate(ctx, ids, 5, &gp, NULL, NULL, &res), WASTE_E_CTX, "ctx_tokens 4");
    waste_close(ctx);
    cfg.tokenizer_only = 1; cfg.ctx_tokens = 0;
    ctx = tk_open(dir, &cfg);
    if (!ctx) { tk_failures++; return; }
    REFUSED(waste_eval(ctx, ids, 1, NULL, 0), WASTE_E_UNSUPPORTED, "tokenizer_only");
    REFUSED(waste_snapshot_size(ctx, &n), WASTE_E_UNSUPPORTED, "tokenizer_only");
    waste_close(ctx);
}

/* ==== pieces + tail ================================================================= */
typedef struct {
    waste_ctx *ctx;
    int32_t toks[128]; uint32_t n;
    char text[2048]; uint32_t len;
    int stop_when_held, abort_when_held, close_inside;
} run_state;

/* A token whose piece is shorter than its bytes is holding an incomplete character. */
static int32_t collect(const waste_token_info *info, void *user) {
    run_state *r = user;
    r->toks[r->n++] = info->token;
    memcpy(r->text + r->len, info->piece, info->piece_len);
    r->len += info->piece_len;
    if (r->close_inside) waste_close(r->ctx);   /* a no-op during the call */
    int held = info->piece_len == 0 && info->token < TK_NBASE + 4;   /* ids >= 264 have no text */
    if (held && r->abort_when_held) waste_abort(r->ctx);
    return held && r->stop_when_held ? 1 : 0;
}

/* Generates at a high temperature until the callback sees a held byte; checks that the
 * pieces plus res.tail equal detokenize(ids). Returns how many runs had a held tail. */
static int tail_runs(waste_ctx *ctx, int stop, int abort_) {
    int with_tail = 0;
    for (uint64_t seed = 0; seed < 200 && with_tail < 5; seed++) {
        run_state r; memset(&r, 0, sizeof r);
        r.ctx = ctx; r.stop_when_held = stop; r.abort_when_held = abort_;
        waste_reset(ctx);
        int32_t prompt[2] = {(int32_t)(seed % 200) + 3, 7};
        waste_gen_params gp; waste_gen_params_init(&gp);
        gp.temperature = 4.0f; gp.seed = seed; gp.max_tokens = 60;
        waste_gen_result res; waste_gen_result_init(&res);
        int32_t st = waste_generate(ctx, prompt, 2, &gp, collect, &r, &res);
        int textless = 0;
        for (uint32_t i = 0; i < r.n; i++) textless |= r.toks[i] >= TK_NBASE + 4;
        if (textless) continue;   /* detokenize refuses ids without text; their pieces are empty */
        char det[4096]; uint64_t n = 0;
        CHECK(waste_detokenize(ctx, r.toks, r.n, det, sizeof det, &n) == WASTE_OK);
        CHECK(res.tail_len <= 3);
        memcpy(r.text + r.len, res.tail, res.tail_len);
        CHECK(n == r.len + res.tail_len && memcmp(det, r.text, n) == 0);
        if (abort_ && st == WASTE_E_CANCELLED) { with_tail += res.tail_len > 0; continue; }
        CHECK(st == WASTE_OK);
        if (res.stop_reason == WASTE_STOP_CALLBACK) { CHECK(res.tail_len > 0); with_tail++; }
        else CHECK(res.tail_len == 0);   /* flushed by a stop id, max_tokens or a full context */
    }
    return with_tail;
}

static void pieces_and_tail_equal_detokenize(const char *dir) {
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    CHECK(tail_runs(ctx, 1, 0) == 5);   /* callback stop inside a character */
    CHECK(tail_runs(ctx, 0, 1) == 5);   /* abort inside a character */
    CHECK(tail_runs(ctx, 0, 0) == 0);   /* runs to max_tokens: nothing held at the end */
    waste_close(ctx);
}

/* ==== close during a call =========================================================== */
static void close_inside_the_callback_is_a_no_op(const char *dir) {
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    run_state r; memset(&r, 0, sizeof r);
    r.ctx = ctx; r.close_inside = 1;
    int32_t prompt[3] = {3, 4, 5};
    waste_gen_params gp; waste_gen_params_init(&gp); gp.max_tokens = 6;
    waste_gen_result res; waste_gen_result_init(&res);
    CHECK(waste_generate(ctx, prompt, 3, &gp, collect, &r, &res) == WASTE_OK);
    CHECK(res.tokens_generated == 6 && r.n == 6 && waste_position(ctx) == 3 + 5);
    float logits[TK_V];
    CHECK(waste_eval(ctx, &r.toks[5], 1, logits, TK_V) == WASTE_OK);   /* still open and usable */
    waste_close(ctx);
}

/* ==== poison ========================================================================= */
static void only_reset_clears_poison(const char *dir) {
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    int32_t ids[4] = {3, 4, 5, 6};
    CHECK(waste_eval(ctx, ids, 4, NULL, 0) == WASTE_OK);
    uint64_t size = 0, got = 0;
    CHECK(waste_snapshot_size(ctx, &size) == WASTE_OK);
    char *snap = malloc(size);
    CHECK(waste_snapshot_save(ctx, snap, size, &got) == WASTE_OK);
    waste_close(ctx);
    /* Damage every record body, so the first expert read fails under verify (E_IO). */
    long long rec = 4096 + 256 + 9;
    for (int e = 0; e < TK_E; e++) CHECK(tk_patch_file(dir, "experts-L1.bin", rec + (long long)e * TK_RECORD, "\x5a", 1) == 0);
    waste_cfg cfg; waste_cfg_init(&cfg);
    cfg.usage_path = ""; cfg.n_threads = 1; cfg.verify = 1;
    ctx = tk_open(dir, &cfg);
    if (!ctx) { tk_failures++; free(snap); return; }
    CHECK(refused(ctx, waste_eval(ctx, ids, 4, NULL, 0), WASTE_E_IO, "checksum mismatch", __LINE__));
    CHECK(refused(ctx, waste_snapshot_load(ctx, snap, got), WASTE_E_STATE, "waste_reset", __LINE__));
    CHECK(refused(ctx, waste_eval(ctx, ids, 1, NULL, 0), WASTE_E_STATE, "waste_reset", __LINE__));
    CHECK(waste_reset(ctx) == WASTE_OK);
    CHECK(waste_snapshot_load(ctx, snap, got) == WASTE_OK && waste_position(ctx) == 4);
    waste_close(ctx);
    free(snap);
    tk_write_container(dir);   /* undamaged again for the next test */
}

/* ==== snapshot segments (docs/FORMAT.md §7.1) ========================================= */
static char *save_segment(waste_ctx *ctx, int32_t whole, uint64_t want_base, uint64_t *len) {
    uint64_t size = 0, base = 99, got = 0;
    CHECK(waste_snapshot_segment_size(ctx, whole, &size, &base) == WASTE_OK && base == want_base);
    char *seg = malloc(size);
    CHECK(seg && waste_snapshot_segment_save(ctx, whole, seg, size, &got) == WASTE_OK && got == size);
    *len = size;
    return seg;
}

/* A chain root + child restores the state a fresh prefill reaches, byte for byte; the child
 * holds only its own positions' latents; a broken chain is E_FORMAT and touches nothing. */
static void segments_chain_exactly(const char *dir) {
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    int32_t ids[9] = {3, 4, 5, 6, 7, 8, 9, 10, 11};
    float fresh[TK_V], restored[TK_V];
    CHECK(waste_eval(ctx, ids, 9, fresh, TK_V) == WASTE_OK);
    CHECK(waste_reset(ctx) == WASTE_OK);
    uint64_t len[3], whole = 0;
    CHECK(waste_eval(ctx, ids, 4, NULL, 0) == WASTE_OK);
    char *root = save_segment(ctx, 0, 0, &len[0]);               /* unanchored: a root */
    CHECK(waste_eval(ctx, ids + 4, 3, NULL, 0) == WASTE_OK);
    char *child = save_segment(ctx, 0, 4, &len[1]);              /* from the anchor at 4 */
    CHECK(waste_eval(ctx, ids + 7, 1, NULL, 0) == WASTE_OK);
    char *grandchild = save_segment(ctx, 0, 7, &len[2]);
    CHECK(waste_snapshot_size(ctx, &whole) == WASTE_OK);
    CHECK(len[2] < whole && len[1] < len[0]);                    /* latents are not repeated */
    uint64_t again = 0, base = 99;
    CHECK(waste_snapshot_segment_size(ctx, 1, &again, &base) == WASTE_OK && base == 0);
    CHECK(waste_reset(ctx) == WASTE_OK);
    CHECK(waste_snapshot_segment_size(ctx, 0, &again, &base) == WASTE_OK && base == 0);   /* reset drops the anchor */
    const void *chain[3] = {root, child, grandchild};
    CHECK(waste_snapshot_chain_load(ctx, chain, len, 3) == WASTE_OK && waste_position(ctx) == 8);
    CHECK(waste_eval(ctx, ids + 8, 1, restored, TK_V) == WASTE_OK);
    CHECK(memcmp(fresh, restored, sizeof fresh) == 0);
    /* The middle of a chain restores too, and becomes the anchor. */
    CHECK(waste_reset(ctx) == WASTE_OK);
    CHECK(waste_snapshot_chain_load(ctx, chain, len, 2) == WASTE_OK && waste_position(ctx) == 7);
    CHECK(waste_snapshot_segment_size(ctx, 0, &again, &base) == WASTE_OK && base == 7);
    CHECK(waste_eval(ctx, ids + 7, 2, restored, TK_V) == WASTE_OK && memcmp(fresh, restored, sizeof fresh) == 0);
    /* Broken chains: nothing restored (the position stays 9). */
    const void *skip[2] = {root, grandchild}, *orphan[1] = {child}, *nulls[2] = {root, NULL};
    uint64_t skip_len[2] = {len[0], len[2]};
    CHECK(refused(ctx, waste_snapshot_chain_load(ctx, skip, skip_len, 2), WASTE_E_FORMAT, "segment 1 starts at 7", __LINE__));
    CHECK(refused(ctx, waste_snapshot_chain_load(ctx, orphan, &len[1], 1), WASTE_E_FORMAT, "segment 0 starts at 4", __LINE__));
    CHECK(refused(ctx, waste_snapshot_chain_load(ctx, nulls, len, 2), WASTE_E_ARG, "segment 1 is NULL", __LINE__));
    CHECK(refused(ctx, waste_snapshot_chain_load(ctx, chain, len, 0), WASTE_E_ARG, "n must be", __LINE__));
    child[60] ^= 1;
    CHECK(refused(ctx, waste_snapshot_chain_load(ctx, chain, len, 3), WASTE_E_FORMAT, "segment 1: crc32", __LINE__));
    child[60] ^= 1;
    CHECK(waste_position(ctx) == 9);
    /* A segment at the right position whose parent is another root (another crc): refused. */
    int32_t others[4] = {3, 4, 5, 12};
    CHECK(waste_reset(ctx) == WASTE_OK && waste_eval(ctx, others, 4, NULL, 0) == WASTE_OK);
    uint64_t other_len = 0, tail_len = 0;
    char *other = save_segment(ctx, 1, 0, &other_len);
    CHECK(waste_eval(ctx, ids + 4, 1, NULL, 0) == WASTE_OK);
    char *tail = save_segment(ctx, 0, 4, &tail_len);
    const void *mixed[2] = {root, tail};
    uint64_t mixed_len[2] = {len[0], tail_len};
    CHECK(refused(ctx, waste_snapshot_chain_load(ctx, mixed, mixed_len, 2), WASTE_E_FORMAT, "not where segment 0 ends", __LINE__));
    CHECK(waste_position(ctx) == 5);
    /* A whole snapshot load drops the anchor; the intact chain still restores. */
    uint64_t wsize = 0, wgot = 0;
    CHECK(waste_snapshot_size(ctx, &wsize) == WASTE_OK);
    char *w = malloc(wsize);
    CHECK(w && waste_snapshot_save(ctx, w, wsize, &wgot) == WASTE_OK && waste_snapshot_load(ctx, w, wgot) == WASTE_OK);
    CHECK(waste_snapshot_segment_size(ctx, 0, &again, &base) == WASTE_OK && base == 0);
    CHECK(waste_snapshot_chain_load(ctx, chain, len, 3) == WASTE_OK && waste_position(ctx) == 8);
    free(w);
    waste_close(ctx);
    free(root); free(child); free(grandchild); free(other); free(tail);
}

static void piece_out_of_memory_poisons(const char *dir) {
#ifdef CAN_FAIL_REALLOC
    waste_ctx *ctx = tk_open(dir, NULL);
    if (!ctx) { tk_failures++; return; }
    int32_t prompt[3] = {3, 4, 5};
    waste_gen_params gp; waste_gen_params_init(&gp); gp.max_tokens = 4;
    waste_gen_result res; waste_gen_result_init(&res);
    fail_realloc = 1;   /* the piece buffer is the only realloc of a generate call */
    int32_t st = waste_generate(ctx, prompt, 3, &gp, NULL, NULL, &res);
    fail_realloc = 0;
    CHECK(refused(ctx, st, WASTE_E_NOMEM, "piece", __LINE__));
    CHECK(refused(ctx, waste_eval(ctx, prompt, 1, NULL, 0), WASTE_E_STATE, "waste_reset", __LINE__));
    CHECK(waste_reset(ctx) == WASTE_OK && waste_eval(ctx, prompt, 1, NULL, 0) == WASTE_OK);
    waste_close(ctx);
#else
    (void)dir;
    printf("test_rules: piece E_NOMEM not injected (ASan owns realloc); the plain build runs it\n");
#endif
}

/* ==== kernel sets ==================================================================== */
static void every_kernel_set_gives_the_same_bytes(const char *dir) {
    float ref[TK_V], got[TK_V];
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (i * 37 + 11) % TK_V;
    int ran = 0;
    for (int32_t k = WASTE_KERNELS_GENERIC; k <= WASTE_KERNELS_AVX512; k++) {
        waste_cfg cfg; waste_cfg_init(&cfg);
        cfg.usage_path = ""; cfg.n_threads = 1; cfg.kernels = k;
        char err[512] = "";
        waste_ctx *ctx = NULL;
        int32_t st = waste_open(dir, &cfg, &ctx, err, sizeof err);
        if (st == WASTE_E_UNSUPPORTED) {
            CHECK(strstr(err, k == WASTE_KERNELS_AVX2 ? "avx2" : "avx512") != NULL);
            printf("test_rules: kernels %d unavailable: %s\n", k, err);
            continue;
        }
        CHECK(st == WASTE_OK);
        if (st) continue;
        float *dst = k == WASTE_KERNELS_GENERIC ? ref : got;
        for (int i = 0; i < 40; i++) CHECK(waste_eval(ctx, &ids[i], 1, dst, TK_V) == WASTE_OK);
        if (k != WASTE_KERNELS_GENERIC) { CHECK(memcmp(ref, got, sizeof ref) == 0); ran++; }
        waste_close(ctx);
    }
    waste_cfg cfg; waste_cfg_init(&cfg); cfg.kernels = 4;
    char err[256]; waste_ctx *ctx = NULL;
    CHECK(waste_open(dir, &cfg, &ctx, err, sizeof err) == WASTE_E_ARG && strstr(err, "cfg.kernels 4"));
    printf("test_rules: %d SIMD kernel set(s) compared with generic\n", ran);
}

int main(void) {
    char dir[] = "/tmp/waste-rules-XXXXXX";
    if (!mkdtemp(dir) || tk_write_container(dir)) { printf("FAIL: cannot write the container\n"); return 1; }
    every_refusal_has_a_detail(dir);
    pieces_and_tail_equal_detokenize(dir);
    close_inside_the_callback_is_a_no_op(dir);
    only_reset_clears_poison(dir);
    segments_chain_exactly(dir);
    piece_out_of_memory_poisons(dir);
    every_kernel_set_gives_the_same_bytes(dir);
    tk_remove_container(dir);
    if (tk_failures) { printf("test_rules: %d failure(s)\n", tk_failures); return 1; }
    printf("test_rules: ok\n");
    return 0;
}
