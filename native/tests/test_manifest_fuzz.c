/* test_manifest_fuzz.c — mutated manifests must give a status and a detail, never a crash
 * (run under ASan/UBSan by `make test-asan`). Deterministic: a fixed xorshift seed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "waste.h"

static const char *BASE =
    "{\"format_version\": 1, \"arch\": \"kimi_linear\", \"config\": {\"hidden_size\": 64, \"vocab_size\": 512,"
    " \"num_hidden_layers\": 2, \"intermediate_size\": 128, \"moe_intermediate_size\": 32, \"num_experts\": 8,"
    " \"num_experts_per_token\": 2, \"num_shared_experts\": 1, \"moe_renormalize\": true, \"routed_scaling_factor\": 2.446,"
    " \"num_expert_group\": 1, \"topk_group\": 1, \"layer_types\": [\"linear_attention\", \"full_attention\"],"
    " \"mlp_layer_types\": [\"dense\", \"sparse\"], \"linear_num_heads\": 4, \"linear_head_dim\": 16,"
    " \"linear_conv_kernel_dim\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"kv_lora_rank\": 32,"
    " \"q_lora_rank\": 0, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"hidden_act\": \"silu\","
    " \"rms_norm_eps\": 1e-05, \"mla_norm_eps\": 1e-06, \"kda_l2_eps\": 1e-06, \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"pad_token_id\": 0, \"model_max_length\": 4096}, \"quant\": {\"trunk\": \"f32\", \"experts\": \"f32\", \"group\": 0},"
    " \"tensors\": [{\"name\": \"embed\", \"format\": \"f32\", \"group\": 0, \"shape\": [512, 64], \"file\": \"trunk.bin\","
    " \"offset\": 0, \"length\": 131072, \"on_disk\": true}, {\"name\": \"x\\u00e9\\ud83d\\ude00\", \"format\": \"int8\","
    " \"group\": 32, \"shape\": [4, 64], \"file\": \"trunk.bin\", \"offset\": 131072, \"length\": 272, \"on_disk\": false}],"
    " \"banks\": [{\"layer\": 1, \"file\": \"experts-L1.bin\", \"n_experts\": 8, \"format\": \"f32\", \"group\": 0,"
    " \"record_bytes\": 28672, \"shapes\": [[32, 64], [32, 64], [64, 32]]}], \"tokenizer\": null}";

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static const char *TOKENS[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "-1", "1e309", "18446744073709551616",
                               "4294967296", "null", "true", "0", "\\u0000", "\\ud800", "[[[[[[[[[[[[[[[[[[[[", "99999999"};

int main(void) {
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
    printf("test_manifest_fuzz: ok (plan statuses: OK %d, E_FORMAT %d, E_UNSUPPORTED %d, E_BUDGET %d)\n",
           statuses[0], statuses[2], statuses[6], statuses[3]);
    return statuses[0] > 0 && statuses[2] > 0 ? 0 : 1;
}
