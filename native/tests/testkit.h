/* testkit.h — shared helpers for the C tests: a CHECK macro and a writer for a small,
 * valid, deterministic container (docs/FORMAT.md), so the tests open real data files
 * without Python. Header-only (static functions); each test includes it once.
 *
 * The container: hidden 64, two layers — layer 0 KDA (2 heads x 16, conv 4) with a dense
 * FFN (128), layer 1 MLA (2 heads, kv rank 16, nope/rope/v 8/8/8) with a MoE (4 experts of
 * width 32, top 2, 1 shared) — all f32. The tokenizer has the 256 single bytes plus four
 * multi-byte merges (n_base_vocab 260), four specials 260..263 and vocab 272, so ids
 * 264..271 are embedding rows without text. Weights come from a fixed xorshift seed.
 */
#ifndef WASTE_TESTKIT_H
#define WASTE_TESTKIT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "waste.h"

#define TK_UNUSED __attribute__((unused))

static int tk_failures TK_UNUSED;
#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                    \
            tk_failures++;                                                            \
        }                                                                             \
    } while (0)

enum { TK_H = 64, TK_V = 272, TK_NBASE = 260, TK_HK = 2, TK_D = 16, TK_HD = 32, TK_K = 4, TK_I = 128,
       TK_IM = 32, TK_E = 4, TK_MH = 2, TK_R = 16, TK_DN = 8, TK_DR = 8, TK_DV = 8 };

/* ==== bytes ======================================================================== */
TK_UNUSED static uint32_t tk_crc32(const uint8_t *p, uint64_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (uint64_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

TK_UNUSED static void tk_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
TK_UNUSED static void tk_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

TK_UNUSED static uint64_t tk_rng = 0x9E3779B97F4A7C15ull;
TK_UNUSED static float tk_uniform(float scale) {
    tk_rng ^= tk_rng << 13; tk_rng ^= tk_rng >> 7; tk_rng ^= tk_rng << 17;
    return scale * ((float)(tk_rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
}

TK_UNUSED static int tk_write_file(const char *dir, const char *name, const void *data, uint64_t n) {
    char path[512]; snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, (size_t)n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* ==== manifest + trunk ============================================================= */
typedef struct { char *json; uint64_t json_len, json_cap; uint8_t *trunk; uint64_t trunk_len, trunk_cap; } tk_build;

TK_UNUSED static void tk_append(tk_build *b, const char *s) {
    uint64_t n = strlen(s);
    if (b->json_len + n + 1 > b->json_cap) {
        b->json_cap = (b->json_len + n + 1) * 2;
        b->json = realloc(b->json, b->json_cap);
    }
    memcpy(b->json + b->json_len, s, n + 1);
    b->json_len += n;
}

/* Appends one f32 tensor [rows, cols] (cols 0: a vector of rows) of values base + U(±scale). */
TK_UNUSED static void tk_tensor(tk_build *b, const char *name, uint32_t rows, uint32_t cols, float base, float scale, int on_disk) {
    uint64_t n = (uint64_t)rows * (cols ? cols : 1), len = 4 * n, off = (b->trunk_len + 63) / 64 * 64;
    if (off + len > b->trunk_cap) {
        b->trunk_cap = (off + len) * 2;
        b->trunk = realloc(b->trunk, b->trunk_cap);
    }
    memset(b->trunk + b->trunk_len, 0, off - b->trunk_len);
    for (uint64_t i = 0; i < n; i++) { float v = base + tk_uniform(scale); memcpy(b->trunk + off + 4 * i, &v, 4); }
    b->trunk_len = off + len;
    char shape[48], item[400];
    if (cols) snprintf(shape, sizeof shape, "[%u, %u]", rows, cols); else snprintf(shape, sizeof shape, "[%u]", rows);
    snprintf(item, sizeof item, "%s{\"name\": \"%s\", \"format\": \"f32\", \"group\": 0, \"shape\": %s, \"file\": \"trunk.bin\", "
             "\"offset\": %llu, \"length\": %llu, \"on_disk\": %s}\n", b->json[b->json_len - 2] == '[' ? "" : ",", name, shape,
             (unsigned long long)off, (unsigned long long)len, on_disk ? "true" : "false");
    tk_append(b, item);
}

TK_UNUSED static const char *TK_CONFIG =
    "{\"format_version\": 1, \"arch\": \"kimi_linear\", \"config\": {\"hidden_size\": 64, \"vocab_size\": 272,\n"
    " \"num_hidden_layers\": 2, \"intermediate_size\": 128, \"moe_intermediate_size\": 32, \"num_experts\": 4,\n"
    " \"num_experts_per_token\": 2, \"num_shared_experts\": 1, \"moe_renormalize\": true, \"routed_scaling_factor\": 2.446,\n"
    " \"num_expert_group\": 1, \"topk_group\": 1, \"layer_types\": [\"linear_attention\", \"full_attention\"],\n"
    " \"mlp_layer_types\": [\"dense\", \"sparse\"], \"linear_num_heads\": 2, \"linear_head_dim\": 16,\n"
    " \"linear_conv_kernel_dim\": 4, \"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"kv_lora_rank\": 16,\n"
    " \"q_lora_rank\": 0, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, \"hidden_act\": \"silu\",\n"
    " \"rms_norm_eps\": 1e-05, \"mla_norm_eps\": 1e-06, \"kda_l2_eps\": 1e-06, \"bos_token_id\": 260, \"eos_token_id\": 261,\n"
    " \"pad_token_id\": null, \"model_max_length\": 4096}, \"quant\": {\"trunk\": \"f32\", \"experts\": \"f32\", \"group\": 0},\n"
    " \"tensors\": [\n";

TK_UNUSED static void tk_tensors(tk_build *b) {
    tk_tensor(b, "embed", TK_V, TK_H, 0, 1.0f, 1);
    tk_tensor(b, "final_norm", TK_H, 0, 1, 0.1f, 0);
    tk_tensor(b, "lm_head", TK_V, TK_H, 0, 0.3f, 0);
    tk_tensor(b, "blk.0.attn_norm", TK_H, 0, 1, 0.1f, 0);
    tk_tensor(b, "blk.0.ffn_norm", TK_H, 0, 1, 0.1f, 0);
    const char *kda_h[] = {"blk.0.kda.q_proj", "blk.0.kda.k_proj", "blk.0.kda.v_proj"};
    for (int i = 0; i < 3; i++) tk_tensor(b, kda_h[i], TK_HD, TK_H, 0, 0.2f, 0);
    const char *conv[] = {"blk.0.kda.q_conv", "blk.0.kda.k_conv", "blk.0.kda.v_conv"};
    for (int i = 0; i < 3; i++) tk_tensor(b, conv[i], TK_HD, TK_K, 0, 0.5f, 0);
    tk_tensor(b, "blk.0.kda.a_log", TK_HK, 0, 0, 0.5f, 0);
    tk_tensor(b, "blk.0.kda.dt_bias", TK_HD, 0, 0, 0.5f, 0);
    tk_tensor(b, "blk.0.kda.f_a", TK_D, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.kda.f_b", TK_HD, TK_D, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.kda.b_proj", TK_HK, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.kda.g_a", TK_D, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.kda.g_b", TK_HD, TK_D, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.kda.o_norm", TK_D, 0, 1, 0.1f, 0);
    tk_tensor(b, "blk.0.kda.o_proj", TK_H, TK_HD, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.ffn.gate", TK_I, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.ffn.up", TK_I, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.0.ffn.down", TK_H, TK_I, 0, 0.2f, 0);
    tk_tensor(b, "blk.1.attn_norm", TK_H, 0, 1, 0.1f, 0);
    tk_tensor(b, "blk.1.ffn_norm", TK_H, 0, 1, 0.1f, 0);
    tk_tensor(b, "blk.1.mla.q_proj", TK_MH * (TK_DN + TK_DR), TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.1.mla.kv_a", TK_R + TK_DR, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.1.mla.kv_a_norm", TK_R, 0, 1, 0.1f, 0);
    tk_tensor(b, "blk.1.mla.kv_b", TK_MH * (TK_DN + TK_DV), TK_R, 0, 0.2f, 0);
    tk_tensor(b, "blk.1.mla.o_proj", TK_H, TK_MH * TK_DV, 0, 0.2f, 0);
    tk_tensor(b, "blk.1.moe.router", TK_E, TK_H, 0, 0.3f, 0);
    tk_tensor(b, "blk.1.moe.router_bias", TK_E, 0, 0, 0.1f, 0);
    tk_tensor(b, "blk.1.moe.shared_gate", TK_IM, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.1.moe.shared_up", TK_IM, TK_H, 0, 0.2f, 0);
    tk_tensor(b, "blk.1.moe.shared_down", TK_H, TK_IM, 0, 0.2f, 0);
}

/* ==== expert bank ================================================================== */
#define TK_BODY (3u * TK_IM * TK_H * 4u)
#define TK_RECORD (((256u + TK_BODY) + 4095u) / 4096u * 4096u)

TK_UNUSED static void tk_mat_header(uint8_t *h) {
    uint32_t rows[3] = {TK_IM, TK_IM, TK_H}, cols[3] = {TK_H, TK_H, TK_IM};
    tk_u32(h + 20, 0); tk_u32(h + 24, 0); tk_u32(h + 28, 3);
    for (int m = 0; m < 3; m++) { tk_u32(h + 32 + 4 * m, rows[m]); tk_u32(h + 44 + 4 * m, cols[m]); }
}

TK_UNUSED static int tk_write_bank(const char *dir) {
    uint64_t size = 4096 + (uint64_t)TK_E * TK_RECORD;
    uint8_t *bank = calloc(1, size);
    if (!bank) return -1;
    memcpy(bank, "WSTBANK1", 8); tk_u32(bank + 8, 1); tk_u32(bank + 12, 1); tk_u32(bank + 16, TK_E);
    tk_mat_header(bank);
    tk_u64(bank + 56, TK_RECORD); tk_u64(bank + 64, TK_BODY);
    for (uint32_t e = 0; e < TK_E; e++) {
        uint8_t *r = bank + 4096 + (uint64_t)e * TK_RECORD;
        memcpy(r, "WSTREC01", 8); tk_u32(r + 8, 1); tk_u32(r + 12, 1); tk_u32(r + 16, e);
        tk_mat_header(r);
        uint64_t blk = (uint64_t)TK_IM * TK_H * 4;
        for (int m = 0; m < 3; m++) { tk_u64(r + 56 + 8 * m, m * blk); tk_u64(r + 80 + 8 * m, blk); }
        tk_u64(r + 104, TK_BODY);
        for (uint32_t i = 0; i < TK_BODY / 4; i++) { float v = tk_uniform(0.2f); memcpy(r + 256 + 4 * i, &v, 4); }
        tk_u32(r + 112, tk_crc32(r + 256, TK_BODY));
    }
    int st = tk_write_file(dir, "experts-L1.bin", bank, size);
    free(bank);
    return st;
}

/* ==== tokenizer files ============================================================== */
TK_UNUSED static void tk_b64(const uint8_t *p, int n, char *out) {
    static const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int o = 0;
    for (int i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[o++] = A[w >> 18 & 63]; out[o++] = A[w >> 12 & 63];
        out[o++] = i + 1 < n ? A[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? A[w & 63] : '=';
    }
    out[o] = 0;
}

TK_UNUSED static int tk_write_tokenizer(const char *dir) {
    static const uint8_t merges[4][4] = {{0xC3, 0xA9}, {0xE4, 0xB8}, {0xE4, 0xB8, 0xAD}, {0xF0, 0x9F, 0x98, 0x80}};
    static const int merge_len[4] = {2, 2, 3, 4};
    char *ranks = malloc(64 * TK_NBASE), line[64], b64[16];
    uint64_t n = 0;
    for (int r = 0; r < TK_NBASE; r++) {
        uint8_t byte = (uint8_t)r;
        if (r < 256) tk_b64(&byte, 1, b64); else tk_b64(merges[r - 256], merge_len[r - 256], b64);
        int len = snprintf(line, sizeof line, "%s %d\n", b64, r);
        memcpy(ranks + n, line, (size_t)len); n += (uint64_t)len;
    }
    int st = tk_write_file(dir, "tokenizer.tiktoken", ranks, n);
    free(ranks);
    const char *specials = "[{\"id\": 260, \"text\": \"[BOS]\"}, {\"id\": 261, \"text\": \"[EOS]\"},"
                           " {\"id\": 262, \"text\": \"<|im_end|>\"}, {\"id\": 263, \"text\": \"<|media_pad|>\"}]";
    return st || tk_write_file(dir, "specials.json", specials, strlen(specials));
}

/* Writes the container into dir (created if missing). 0 on success. */
TK_UNUSED static int tk_write_container(const char *dir) {
    mkdir(dir, 0755);
    tk_rng = 0x9E3779B97F4A7C15ull;
    tk_build b = {0};
    tk_append(&b, TK_CONFIG);
    tk_tensors(&b);
    tk_append(&b, "], \"banks\": [{\"layer\": 1, \"file\": \"experts-L1.bin\", \"n_experts\": 4, \"format\": \"f32\", \"group\": 0,"
                  " \"record_bytes\": 28672, \"shapes\": [[32, 64], [32, 64], [64, 32]]}],\n"
                  " \"tokenizer\": {\"pretokenizer\": \"kimi\", \"n_base_vocab\": 260, \"ranks\": \"tokenizer.tiktoken\","
                  " \"specials\": \"specials.json\"}}\n");
    int st = tk_write_file(dir, "manifest.json", b.json, b.json_len) || tk_write_file(dir, "trunk.bin", b.trunk, b.trunk_len) ||
             tk_write_bank(dir) || tk_write_tokenizer(dir);
    free(b.json); free(b.trunk);
    return st;
}

/* Reads a whole file (NUL-terminated copy); NULL on failure. */
TK_UNUSED static char *tk_read_file(const char *dir, const char *name, uint64_t *n) {
    char path[512]; snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END); long sz = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    if (buf && fread(buf, 1, (size_t)sz, f) != (size_t)sz) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[sz] = 0; *n = (uint64_t)sz; }
    return buf;
}

/* Byte offset of tensor `name` in trunk.bin, from the manifest; -1 when absent. */
TK_UNUSED static long long tk_tensor_offset(const char *dir, const char *name) {
    uint64_t n = 0;
    char *m = tk_read_file(dir, "manifest.json", &n), key[160];
    if (!m) return -1;
    snprintf(key, sizeof key, "\"name\": \"%s\"", name);
    char *at = strstr(m, key), *off = at ? strstr(at, "\"offset\": ") : NULL;
    long long v = off ? strtoll(off + 10, NULL, 10) : -1;
    free(m);
    return v;
}

/* Overwrites n bytes of file `name` at byte offset `at`. 0 on success. */
TK_UNUSED static int tk_patch_file(const char *dir, const char *name, long long at, const void *data, uint64_t n) {
    char path[512]; snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int ok = fseek(f, at, SEEK_SET) == 0 && fwrite(data, 1, (size_t)n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Removes the files tk_write_container wrote (and usage.waste), then the directory. */
TK_UNUSED static void tk_remove_container(const char *dir) {
    const char *files[] = {"manifest.json", "trunk.bin", "experts-L1.bin", "tokenizer.tiktoken", "specials.json", "usage.waste"};
    char path[512];
    for (unsigned i = 0; i < sizeof files / sizeof files[0]; i++) { snprintf(path, sizeof path, "%s/%s", dir, files[i]); unlink(path); }
    rmdir(dir);
}

/* Opens dir with cfg (NULL = defaults with usage_path "" and 1 thread); NULL + a printed
 * detail on failure. */
TK_UNUSED static waste_ctx *tk_open(const char *dir, const waste_cfg *cfg_in) {
    waste_cfg cfg;
    if (cfg_in) cfg = *cfg_in; else { waste_cfg_init(&cfg); cfg.usage_path = ""; cfg.n_threads = 1; }
    char err[1024] = "";
    waste_ctx *ctx = NULL;
    int32_t st = waste_open(dir, &cfg, &ctx, err, sizeof err);
    if (st != WASTE_OK) { printf("open %s: %s: %s\n", dir, waste_status_name(st), err); return NULL; }
    return ctx;
}

/* The segment chain round trip (docs/FORMAT.md §7.1) at ctx's position: a root segment
 * saved, two more positions evaluated (next2[0..1]), a child segment saved, then the chain
 * of both restored. Returns the chain load's status; WASTE_OK also when an earlier step
 * refuses, because a context a mutated manifest let open may have no segment to save, but
 * a chain that was saved must load. */
TK_UNUSED static int32_t tk_segment_chain_round_trip(waste_ctx *ctx, const int32_t *next2) {
    int32_t st = WASTE_OK;
    uint64_t base = 0, s1 = 0, s2 = 0, g1 = 0, g2 = 0;
    if (waste_snapshot_segment_size(ctx, 1, &s1, &base) != WASTE_OK) return WASTE_OK;
    void *root = malloc(s1 ? s1 : 1);
    if (waste_snapshot_segment_save(ctx, 1, root, s1, &g1) == WASTE_OK && waste_eval(ctx, next2, 2, NULL, 0) == WASTE_OK
        && waste_snapshot_segment_size(ctx, 0, &s2, &base) == WASTE_OK) {
        void *child = malloc(s2 ? s2 : 1);
        if (waste_snapshot_segment_save(ctx, 0, child, s2, &g2) == WASTE_OK) {
            const void *chain[2] = {root, child};
            uint64_t lens[2] = {g1, g2};
            st = waste_snapshot_chain_load(ctx, chain, lens, 2);
        }
        free(child);
    }
    free(root);
    return st;
}

#endif
