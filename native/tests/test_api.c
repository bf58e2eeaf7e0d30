/* test_api.c — static calls, struct init and argument checks through the public header. */
#include <stdio.h>
#include <string.h>

#include "waste.h"

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

int main(void) {
    CHECK(waste_api_version() == WASTE_API_VERSION);
    CHECK(strlen(waste_version()) > 0);
    CHECK(strstr(waste_build_info(), "format_version 1") != NULL);
    CHECK(strstr(waste_build_info(), "selected: ") != NULL);
#ifdef __linux__
    /* The banks are opened O_DIRECT on Linux; the build information must not say otherwise
     * (api.c once lacked <fcntl.h> and printed "O_DIRECT: no"). */
    CHECK(strstr(waste_build_info(), "O_DIRECT: yes") != NULL);
#endif
    CHECK(strcmp(waste_status_name(WASTE_E_CTX), "E_CTX") == 0);
    CHECK(strcmp(waste_status_name(WASTE_OK), "OK") == 0);
    CHECK(strcmp(waste_status_name(12345), "E_UNKNOWN") == 0);
    CHECK(waste_usable_ram() > (1u << 20));

    waste_cfg cfg; waste_cfg_init(&cfg);
    CHECK(cfg.struct_size == sizeof cfg && cfg.direct_io == 1 && cfg.cache_policy == WASTE_CACHE_LAYER);
    char err[256];
    waste_ctx *ctx = (waste_ctx *)&cfg;
    int32_t st = waste_open("/nonexistent/model.waste", &cfg, &ctx, err, sizeof err);
    CHECK(st == WASTE_E_IO && ctx == NULL);
    CHECK(strstr(err, "/nonexistent/model.waste/manifest.json") != NULL);

    cfg.struct_size = 3;
    st = waste_open("/nonexistent", &cfg, &ctx, err, sizeof err);
    CHECK(st == WASTE_E_ARG && strstr(err, "struct_size") != NULL);
    waste_cfg_init(&cfg);
    cfg.io_threads = 65;
    st = waste_open("/nonexistent", &cfg, &ctx, err, sizeof err);
    CHECK(st == WASTE_E_ARG && strstr(err, "io_threads") != NULL);
    cfg.io_threads = 0; cfg.lookahead = 1;
    st = waste_open("/nonexistent", &cfg, &ctx, err, sizeof err);
    CHECK(st == WASTE_E_ARG && strstr(err, "lookahead needs cfg.io_threads") != NULL);
    cfg.io_threads = 2; cfg.lookahead = 2;
    st = waste_open("/nonexistent", &cfg, &ctx, err, sizeof err);
    CHECK(st == WASTE_E_ARG && strstr(err, "lookahead 2") != NULL);
    waste_cfg_init(&cfg);
    CHECK(waste_open(NULL, NULL, &ctx, err, sizeof err) == WASTE_E_ARG);
    CHECK(waste_open("/x", NULL, NULL, err, 0) == WASTE_E_ARG);

    waste_plan plan; waste_plan_init(&plan);
    waste_cfg_init(&cfg);
    CHECK(waste_plan_memory("/nonexistent", &cfg, &plan, err, sizeof err) == WASTE_E_IO);

    /* NULL-safe calls. */
    waste_close(NULL);
    waste_abort(NULL);
    CHECK(waste_last_error(NULL) != NULL);
    CHECK(waste_eval(NULL, NULL, 0, NULL, 0) == WASTE_E_ARG);
    CHECK(waste_reset(NULL) == WASTE_E_ARG);
    CHECK(waste_position(NULL) == 0);
    waste_stats s; waste_stats_init(&s);
    CHECK(waste_get_stats(NULL, &s) == WASTE_E_ARG);
    CHECK(waste_save_usage(NULL, NULL) == WASTE_E_ARG);
    CHECK(waste_save_usage(NULL, "/tmp/usage.waste") == WASTE_E_ARG);
    CHECK(s.struct_size == sizeof s && s.warm_bytes == 0 && s.peak_bytes == 0 && s.usage_note[0] == 0);

    if (failures) { printf("%d failure(s)\n", failures); return 1; }
    printf("test_api: ok\n");
    return 0;
}
