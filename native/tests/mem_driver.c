/* mem_driver.c — runs a model under a RAM budget and reports the process's peak RSS, so a
 * test can check docs/ENGINE.md §7 "Peak RSS (VmHWM) stays <= budget + 32 MiB" without a Python
 * interpreter's own memory in the way.
 *
 *   mem_driver MODEL BUDGET_BYTES N_TOKENS
 *
 * Evaluates a 32-token prompt, then single tokens up to N_TOKENS (ids drawn from a fixed
 * LCG below the vocabulary), and prints one line of "key value" pairs:
 *   vmhwm_bytes budget_bytes peak_bytes allocated_bytes misses reads slots
 * Exit status: 0 success, 1 an engine error (status and detail on stderr), 64 bad usage.
 * Builds against the public header and libwaste.a:
 *   gcc -std=c11 -O2 -Inative/include native/tests/mem_driver.c native/build/libwaste.a -lm -pthread
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "waste.h"

/* VmHWM from /proc/self/status, in bytes; 0 when unavailable. */
static uint64_t vmhwm_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) { kb = strtoull(line + 6, NULL, 10); break; }
    fclose(f);
    return kb * 1024;
}

static int fail(waste_ctx *ctx, int32_t st, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", what, waste_status_name(st), waste_last_error(ctx));
    waste_close(ctx);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: mem_driver MODEL BUDGET_BYTES N_TOKENS\n"); return 64; }
    waste_cfg cfg; waste_cfg_init(&cfg);
    cfg.ram_budget_bytes = strtoull(argv[2], NULL, 10);
    cfg.usage_path = "";
    cfg.n_threads = 1;
    uint32_t n = (uint32_t)strtoul(argv[3], NULL, 10);
    if (n < 32) { fprintf(stderr, "N_TOKENS must be >= 32\n"); return 64; }
    char err[1024];
    waste_ctx *ctx = NULL;
    int32_t st = waste_open(argv[1], &cfg, &ctx, err, sizeof err);
    if (st) { fprintf(stderr, "open: %s: %s\n", waste_status_name(st), err); return 1; }
    waste_model_info info; waste_model_info_init(&info);
    if ((st = waste_get_model_info(ctx, &info))) return fail(ctx, st, "model_info");
    uint64_t x = 12345;
    int32_t ids[32];
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i % 32] = (int32_t)(3 + (x >> 33) % (info.vocab - 3));
        if (i == 31 && (st = waste_eval(ctx, ids, 32, NULL, 0))) return fail(ctx, st, "eval prompt");
        if (i >= 32 && (st = waste_eval(ctx, &ids[i % 32], 1, NULL, 0))) return fail(ctx, st, "eval token");
    }
    waste_stats s; waste_stats_init(&s);
    if ((st = waste_get_stats(ctx, &s))) return fail(ctx, st, "stats");
    printf("vmhwm_bytes %" PRIu64 " budget_bytes %" PRIu64 " peak_bytes %" PRIu64 " allocated_bytes %" PRIu64
           " misses %" PRIu64 " reads %" PRIu64 " slots %" PRIu64 "\n",
           vmhwm_bytes(), s.budget_bytes, s.peak_bytes, s.allocated_bytes, s.misses, s.reads, s.slots_total);
    waste_close(ctx);
    return 0;
}
