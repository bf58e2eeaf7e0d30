/* test_manifest_fuzz.c — mutated manifests must give a status and a detail, never a crash
 * (run under ASan/UBSan by `make test-asan`). Deterministic: fixed xorshift seeds.
 *
 * Two campaigns. (1) Plan only: a manifest alone, byte-level edits (plan reads nothing
 * else). (2) With data: a real container (testkit.h) whose manifest gets token-level edits
 * (numbers, booleans, on_disk flips, format names); whenever open succeeds the ctx is
 * exercised — eval, generate, snapshot save/load, markup tokenize — so binding and the
 * forward pass see what validation let through. */
#include "testkit.h"

static const char *BASE =
    "{\"format_version\": 1, \"arch\": \"kimi_linear\", \"config\": {\"hidden_size\": 64, \"vocab_size\": 512,"
    " \"num_hidden_layers\": 2, \"intermediate_size\": 128, \"moe_intermediate_size\": 32, \"num_experts\": 8,"
    " \"num_experts_per_token\": 2, \"num_shared_experts\": 1, \"moe_renormalize\": true, \"routed_scaling_factor\": 2.446,"
    " \"num_expert_group\": 1, \"topk_group\": 1, \"layer_types\": [\"linear_attention\", \"full_attention\"],"
    " \"mlp_layer_types\": [\"dense\", \"sparse\"], \"linear_num_heads\": 4, \"linear_head_dim\": 16,"
    " \"linear_conv_kernel_dim\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"kv_lora_rank\": 32,"
    " \"q_lora_rank\": 0, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"hidden_act\": \"silu\","
    " \"rms_norm_eps\": 1e-05, \"mla_norm_eps\": 1e-06, \"kda_l2_eps\": 1e-06, \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"pad_token_id\": 0, \"model_max_length\": 4096}, \"quant\": {\"trunk\": \"f32 \\u00e9\\ud83d\\ude00\", \"experts\": \"f32\", \"group\": 0},"
    " \"tensors\": [{\"name\": \"embed\", \"format\": \"f32\", \"group\": 0, \"shape\": [512, 64], \"file\": \"trunk.bin\","
    " \"offset\": 0, \"length\": 131072, \"on_disk\": true}, {\"name\": \"blk.0.ffn.gate\", \"format\": \"int8\","
    " \"group\": 32, \"shape\": [4, 64], \"file\": \"trunk.bin\", \"offset\": 131072, \"length\": 272, \"on_disk\": false}],"
    " \"banks\": [{\"layer\": 1, \"file\": \"experts-L1.bin\", \"n_experts\": 8, \"format\": \"f32\", \"group\": 0,"
    " \"record_bytes\": 28672, \"shapes\": [[32, 64], [32, 64], [64, 32]]}], \"tokenizer\": null}";

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static const char *TOKENS[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "-1", "1e309", "18446744073709551616",
                               "4294967296", "null", "true", "0", "\\u0000", "\\ud800", "[[[[[[[[[[[[[[[[[[[[", "99999999"};

static int fuzz_plan(void) {
    char dir[] = "/tmp/waste-fuzz-XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char path[256]; snprintf(path, sizeof path, "%s/manifest.json", dir);
    size_t base_len = strlen(BASE);
    char *buf = malloc(base_len * 2 + 64);
    int statuses[16] = {0};
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = base_len;
        memcpy(buf, BASE, n);
        int edits = 1 + (int)(next() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = next() % n;
            switch (next() % 4) {
            case 0: buf[at] = (char)(next() & 0xFF); break;                      /* flip a byte */
            case 1: n = at; break;                                                  /* truncate */
            case 2: memmove(buf + at, buf + at + 1, n - at - 1); n--; break;        /* delete */
            default: {                                                              /* insert a token */
                const char *t = TOKENS[next() % (sizeof TOKENS / sizeof TOKENS[0])];
                size_t tl = strlen(t);
                if (n + tl < base_len * 2) { memmove(buf + at + tl, buf + at, n - at); memcpy(buf + at, t, tl); n += tl; }
            }
            }
            if (n == 0) break;
        }
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, n, f);
        fclose(f);
        char err[512] = {0};
        waste_plan plan; waste_plan_init(&plan);
        int32_t st = waste_plan_memory(dir, NULL, &plan, err, sizeof err);
        if (st != WASTE_OK && err[0] == 0) { printf("FAIL: status %d without detail at iteration %d\n", st, iter); return 1; }
        if (st > 0 || st < -11) { printf("FAIL: unknown status %d\n", st); return 1; }
        statuses[-st]++;
        waste_ctx *ctx = NULL;
        st = waste_open(dir, NULL, &ctx, err, sizeof err);
        if (st == WASTE_OK) { printf("FAIL: opened a container without data files\n"); return 1; }
        if (err[0] == 0) { printf("FAIL: open status %d without detail\n", st); return 1; }
    }
    unlink(path);
    rmdir(dir);
    free(buf);
    printf("test_manifest_fuzz: plan campaign: 3000 runs (OK %d, E_FORMAT %d, E_UNSUPPORTED %d, E_BUDGET %d)\n",
           statuses[0], statuses[2], statuses[6], statuses[3]);
    return statuses[0] > 0 && statuses[2] > 0 ? 0 : 1;
}

/* ==== campaign 2: with data files ================================================== */
static const char *REPL[] = {"0", "1", "2", "3", "-1", "true", "false", "null", "4096", "65536", "16777216",
                             "16777217", "1e-30", "63", "64", "4097", "2147483647", "[]", "{}", "\"f32\"", "\"int8\"",
                             "\"bf16\"", "32", "128", "7", "271", "272", "1e309"};

/* Replaces one scalar value (a number, true/false/null or a string that follows ':', '['
 * or ',') with a token from REPL; half the time inside the config (before "tensors"),
 * where an edit often still opens. */
static int value_start(const char *buf, size_t at) {
    char c = buf[at];
    if (!((c >= '0' && c <= '9') || c == '-' || c == 't' || c == 'f' || c == 'n' || c == '"')) return 0;
    size_t p = at;
    while (p > 0 && buf[p - 1] == ' ') p--;
    if (p == 0) return 0;
    char before = buf[p - 1];
    if (before == ':' || before == '[') return 1;
    return before == ',' && c != '"';   /* after ',' a quote starts a key in objects */
}

static size_t mutate_token(char *buf, size_t m, size_t room) {
    buf[m] = 0;
    const char *tensors = strstr(buf, "\"tensors\"");
    size_t span = tensors && next() % 2 ? (size_t)(tensors - buf) : m;
    size_t at = next() % span, tries = 0;
    while (tries++ < m && !value_start(buf, at)) at = (at + 1) % m;
    size_t end = at + 1;
    if (buf[at] == '"') { while (end < m && buf[end] != '"') end++; if (end < m) end++; }
    else while (end < m && ((buf[end] >= '0' && buf[end] <= '9') || buf[end] == '.' || buf[end] == 'e' || buf[end] == '-' ||
                            buf[end] == '+' || (buf[end] >= 'a' && buf[end] <= 'z'))) end++;
    const char *r = REPL[next() % (sizeof REPL / sizeof REPL[0])];
    size_t rl = strlen(r);
    if (m - (end - at) + rl > room) return m;
    memmove(buf + at + rl, buf + end, m - end);
    memcpy(buf + at, r, rl);
    return m - (end - at) + rl;
}

/* Sets the k-th `"on_disk": false` to true (a resident tensor claimed on disk). */
static void flip_on_disk(char *buf, size_t m) {
    buf[m] = 0;
    int k = (int)(next() % 30);
    for (char *p = strstr(buf, "\"on_disk\": false"); p; p = strstr(p + 1, "\"on_disk\": false"))
        if (k-- == 0) { memcpy(p + 11, "true ", 5); return; }
}

/* Uses an opened ctx the way a host would; any crash or sanitizer report fails the test. */
static void exercise(waste_ctx *ctx) {
    waste_model_info info; waste_model_info_init(&info);
    if (waste_get_model_info(ctx, &info) != WASTE_OK || info.vocab == 0) { printf("FAIL: model_info\n"); tk_failures++; return; }
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = (int32_t)(next() % info.vocab);
    float *logits = malloc(4ull * info.vocab);
    int32_t st = waste_eval(ctx, ids, 20, logits, info.vocab);
    if (st != WASTE_OK && !waste_last_error(ctx)[0]) { printf("FAIL: eval status %d without detail\n", st); tk_failures++; }
    waste_gen_params gp; waste_gen_params_init(&gp); gp.max_tokens = 4; gp.temperature = 0.8f; gp.seed = next();
    waste_gen_result res; waste_gen_result_init(&res);
    waste_reset(ctx);
    waste_generate(ctx, ids, 3, &gp, NULL, NULL, &res);
    uint64_t size = 0, got = 0;
    if (waste_snapshot_size(ctx, &size) == WASTE_OK) {
        void *snap = malloc(size ? size : 1);
        if (waste_snapshot_save(ctx, snap, size, &got) == WASTE_OK) waste_snapshot_load(ctx, snap, got);
        free(snap);
    }
    st = tk_segment_chain_round_trip(ctx, ids + 3);
    if (st != WASTE_OK) { printf("FAIL: chain load status %d: %s\n", st, waste_last_error(ctx)); tk_failures++; }
    int32_t toks[64]; uint64_t nt;
    waste_tokenize_markup(ctx, "hello <|im_end|> world", 22, 1, toks, 64, &nt);
    free(logits);
}

static int fuzz_with_data(int runs) {
    char dir[] = "/tmp/waste-fuzzd-XXXXXX";
    if (!mkdtemp(dir) || tk_write_container(dir)) { printf("FAIL: cannot write the container\n"); return 1; }
    uint64_t n = 0;
    char *base = tk_read_file(dir, "manifest.json", &n);
    size_t room = (size_t)n * 2 + 256;
    char *buf = malloc(room + 1);
    int statuses[16] = {0};
    rng = 0x5DEECE66Dull;
    for (int it = 0; it < runs; it++) {
        size_t m = (size_t)n;
        memcpy(buf, base, m);
        int edits = 1 + (int)(next() % 2);
        for (int e = 0; e < edits; e++) {
            if (next() % 6 == 0) flip_on_disk(buf, m);
            else m = mutate_token(buf, m, room);
        }
        tk_write_file(dir, "manifest.json", buf, m);
        waste_cfg cfg; waste_cfg_init(&cfg);
        cfg.usage_path = ""; cfg.ctx_tokens = 64; cfg.n_threads = 1; cfg.verify = (int32_t)(next() & 1);
        char err[512] = "";
        waste_ctx *ctx = NULL;
        int32_t st = waste_open(dir, &cfg, &ctx, err, sizeof err);
        if (st > 0 || st < -11) { printf("FAIL: unknown status %d\n", st); return 1; }
        if (st != WASTE_OK && !err[0]) { printf("FAIL: open status %d without detail at run %d\n", st, it); return 1; }
        statuses[-st]++;
        if (st == WASTE_OK) { exercise(ctx); waste_close(ctx); }
    }
    tk_remove_container(dir);
    free(buf); free(base);
    printf("test_manifest_fuzz: data campaign: %d runs (OK %d, E_FORMAT %d, E_UNSUPPORTED %d, E_IO %d, E_BUDGET %d)\n",
           runs, statuses[0], statuses[2], statuses[6], statuses[1], statuses[3]);
    return statuses[0] > 0 && statuses[2] > 0 ? 0 : 1;
}

int main(void) {
    int st = fuzz_plan();
    st |= fuzz_with_data(1000);
    if (tk_failures) printf("%d failure(s)\n", tk_failures);
    return st || tk_failures ? 1 : 0;
}
