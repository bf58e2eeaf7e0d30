/* api.c — the public functions of waste.h: static info, memory planning, open/close,
 * tokenizer calls with UTF-8 pieces, eval/generate with chunked prefill, snapshots,
 * statistics and the busy/abort/poison rules (engine.md §1–2). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "engine.h"
#include "tokenizer.h"

/* ==== static information =========================================================== */
static pthread_once_t build_once = PTHREAD_ONCE_INIT;
static char build_info[256];

static void make_build_info(void) {
#if defined(__clang__)
    const char *cc = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *cc = "gcc " __VERSION__;
#else
    const char *cc = "unknown compiler";
#endif
#ifdef O_DIRECT
    const char *od = "yes";
#else
    const char *od = "no";
#endif
    snprintf(build_info, sizeof build_info, "libwaste %s; %s; kernels built: %s; selected: %s; format_version %d; O_DIRECT: %s",
             WASTE_VERSION_STRING, cc, wk_built(), wk_best(), WASTE_FORMAT_VERSION, od);
}

WASTE_API const char *waste_version(void) { return WASTE_VERSION_STRING; }
WASTE_API uint32_t waste_api_version(void) { return WASTE_API_VERSION; }
WASTE_API const char *waste_build_info(void) { pthread_once(&build_once, make_build_info); return build_info; }

WASTE_API const char *waste_status_name(int32_t s) {
    switch (s) {
    case WASTE_OK: return "OK"; case WASTE_E_IO: return "E_IO"; case WASTE_E_FORMAT: return "E_FORMAT";
    case WASTE_E_BUDGET: return "E_BUDGET"; case WASTE_E_NOMEM: return "E_NOMEM"; case WASTE_E_ARG: return "E_ARG";
    case WASTE_E_UNSUPPORTED: return "E_UNSUPPORTED"; case WASTE_E_CANCELLED: return "E_CANCELLED";
    case WASTE_E_BUSY: return "E_BUSY"; case WASTE_E_STATE: return "E_STATE"; case WASTE_E_SPACE: return "E_SPACE";
    case WASTE_E_CTX: return "E_CTX"; default: return "E_UNKNOWN";
    }
}

/* ==== usable RAM: min(physical, cgroup limits up the path) ======================== */
static uint64_t read_limit(const char *path) {
    FILE *f = fopen(path, "re");
    if (!f) return UINT64_MAX;
    char buf[64] = {0};
    uint64_t v = UINT64_MAX;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3)) {
        char *end; unsigned long long x = strtoull(buf, &end, 10);
        if (end != buf) v = x;
    }
    fclose(f);
    return v;
}

static uint64_t cgroup_limit(void) {
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return UINT64_MAX;
    char line[1024];
    uint64_t best = UINT64_MAX;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'); if (!c1) continue;
        char *c2 = strchr(c1 + 1, ':'); if (!c2) continue;
        *c2 = 0;
        const char *ctrl = c1 + 1, *rel = c2 + 1;
        int v2 = ctrl[0] == 0, v1mem = strstr(ctrl, "memory") != NULL;
        if (!v2 && !v1mem) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s", rel);
        for (;;) {
            char file[1400];
            if (v2) {
                snprintf(file, sizeof file, "/sys/fs/cgroup%s/memory.max", path);
                uint64_t a = read_limit(file); if (a < best) best = a;
                snprintf(file, sizeof file, "/sys/fs/cgroup%s/memory.high", path);
                a = read_limit(file); if (a < best) best = a;
            } else {
                snprintf(file, sizeof file, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", path);
                uint64_t a = read_limit(file); if (a < best) best = a;
            }
            char *slash = strrchr(path, '/');
            if (!slash || (slash == path && path[1] == 0)) break;
            if (slash == path) path[1] = 0; else *slash = 0;
        }
    }
    fclose(f);
    return best;
}

WASTE_API uint64_t waste_usable_ram(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t phys = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
    uint64_t cg = cgroup_limit();
    return cg < phys ? cg : phys;
}

/* ==== struct init ================================================================== */
WASTE_API void waste_cfg_init(waste_cfg *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->cache_policy = WASTE_CACHE_LFRU;
    c->direct_io = 1;
}
WASTE_API void waste_plan_init(waste_plan *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }
WASTE_API void waste_model_info_init(waste_model_info *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }
WASTE_API void waste_gen_params_init(waste_gen_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->top_p = 1.0f;
}
WASTE_API void waste_gen_result_init(waste_gen_result *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }
WASTE_API void waste_stats_init(waste_stats *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }

/* ==== memory accounting ============================================================ */
/* Only the calling thread changes the counters (under the busy flag); get_stats reads them. */
void wx_mem_add(waste_ctx *ctx, uint64_t bytes) {
    uint64_t now = atomic_fetch_add(&ctx->mem_now, bytes) + bytes;
    uint64_t peak = atomic_load(&ctx->mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&ctx->mem_peak, &peak, now)) {}
}

void wx_mem_sub(waste_ctx *ctx, uint64_t bytes) { atomic_fetch_sub(&ctx->mem_now, bytes); }

void wx_err(waste_ctx *ctx, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    wu_vformat(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
}

/* ==== plan and open ================================================================ */
static int32_t check_cfg(const waste_cfg *cfg, char *err, uint64_t cap) {
    if (!cfg) return WASTE_OK;
    if (cfg->struct_size != sizeof(waste_cfg)) {
        wu_errf(err, cap, "waste_cfg.struct_size is %u, expected %u (call waste_cfg_init)", cfg->struct_size, (unsigned)sizeof(waste_cfg));
        return WASTE_E_ARG;
    }
    if (cfg->cache_policy != WASTE_CACHE_LFRU && cfg->cache_policy != WASTE_CACHE_LRU) { wu_errf(err, cap, "cfg.cache_policy %d unknown", cfg->cache_policy); return WASTE_E_ARG; }
    if (cfg->kernels < WASTE_KERNELS_AUTO || cfg->kernels > WASTE_KERNELS_AVX512) { wu_errf(err, cap, "cfg.kernels %d unknown (0 auto, 1 generic, 2 avx2, 3 avx512)", cfg->kernels); return WASTE_E_ARG; }
    const char *why = NULL;
    if (!wk_select(cfg->kernels, &why)) {
        wu_errf(err, cap, "cfg.kernels %d (%s): %s", cfg->kernels, cfg->kernels == WASTE_KERNELS_AVX2 ? "avx2" : "avx512", why);
        return WASTE_E_UNSUPPORTED;
    }
    if (cfg->ctx_tokens > (1u << 24)) { wu_errf(err, cap, "cfg.ctx_tokens %u above 16777216", cfg->ctx_tokens); return WASTE_E_ARG; }
    if (cfg->n_threads > 1024) { wu_errf(err, cap, "cfg.n_threads %u above 1024", cfg->n_threads); return WASTE_E_ARG; }
    if (cfg->prefill_chunk > 4096) { wu_errf(err, cap, "cfg.prefill_chunk %u above 4096", cfg->prefill_chunk); return WASTE_E_ARG; }
    if (cfg->io_threads) { wu_errf(err, cap, "cfg.io_threads: read-ahead threads are not implemented yet"); return WASTE_E_UNSUPPORTED; }
    if (cfg->lookahead) { wu_errf(err, cap, "cfg.lookahead: router lookahead is not implemented yet"); return WASTE_E_UNSUPPORTED; }
    if (cfg->vision) { wu_errf(err, cap, "cfg.vision: the vision tower is not implemented yet"); return WASTE_E_UNSUPPORTED; }
    return WASTE_OK;
}

WASTE_API int32_t waste_plan_memory(const char *path, const waste_cfg *cfg_in, waste_plan *plan, char *err, uint64_t cap) {
    if (err && cap) err[0] = 0;
    if (!path || !plan) { wu_errf(err, cap, "path and plan must not be NULL"); return WASTE_E_ARG; }
    if (plan->struct_size != sizeof *plan) { wu_errf(err, cap, "waste_plan.struct_size mismatch (call waste_plan_init)"); return WASTE_E_ARG; }
    waste_cfg dflt; waste_cfg_init(&dflt);
    const waste_cfg *cfg = cfg_in ? cfg_in : &dflt;
    int32_t st = check_cfg(cfg, err, cap);
    if (st) return st;
    wc_container *c = calloc(1, sizeof *c);
    if (!c) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    st = wc_open_manifest(path, c, err, cap);
    if (!st) {
        wm_sizing s;
        uint32_t T = cfg->ctx_tokens ? cfg->ctx_tokens : 4096, chunk = cfg->prefill_chunk ? cfg->prefill_chunk : 64;
        st = wm_sizing_compute(c, T, chunk, cfg->ram_budget_bytes, &s, err, cap);
        plan->trunk_bytes = s.trunk; plan->state_bytes = s.state; plan->scratch_bytes = s.scratch; plan->vision_bytes = s.vision;
        plan->min_cache_bytes = s.min_cache; plan->floor_bytes = s.floor; plan->working_set_bytes = s.working_set;
        plan->expert_bytes = s.experts; plan->recommended_bytes = s.recommended; plan->auto_bytes = s.auto_budget;
        plan->usable_ram_bytes = s.usable; plan->budget_bytes = s.budget; plan->record_bytes = s.record; plan->slots = s.slots;
    }
    wc_close(c);
    free(c);
    return st;
}

/* Parses "0-3,6" into CPU ids (at most 1024, each < CPU_SETSIZE). */
static int32_t parse_cpu_list(const char *s, int **out, uint32_t *n_out, char *err, uint64_t cap) {
    int *cpus = malloc(1024 * sizeof(int));
    uint32_t n = 0;
    if (!cpus) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0) goto bad;
        p = end;
        if (*p == '-') {
            p++;
            b = strtol(p, &end, 10);
            if (end == p || b < a) goto bad;
            p = end;
        }
        if (b >= CPU_SETSIZE) goto bad;
        for (long c = a; c <= b; c++) { if (n >= 1024) goto bad; cpus[n++] = (int)c; }
        if (*p == ',') p++;
        else if (*p) goto bad;
    }
    if (n == 0) goto bad;
    *out = cpus; *n_out = n;
    return WASTE_OK;
bad:
    free(cpus);
    wu_errf(err, cap, "cfg.cpu_list \"%s\" is not a list like \"0-3,6\" of CPUs below %d", s, CPU_SETSIZE);
    return WASTE_E_ARG;
}

/* The caller is worker 0: pinned to the first listed CPU only during compute calls. */
typedef struct { int pinned; cpu_set_t saved; } caller_pin;

static void pin_caller(waste_ctx *ctx, caller_pin *cp) {
    cp->pinned = 0;
    if (!ctx->cpus) return;
    if (pthread_getaffinity_np(pthread_self(), sizeof cp->saved, &cp->saved) != 0) return;
    cpu_set_t set; CPU_ZERO(&set); CPU_SET(ctx->cpus[0], &set);
    cp->pinned = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

static void unpin_caller(caller_pin *cp) {
    if (cp->pinned) pthread_setaffinity_np(pthread_self(), sizeof cp->saved, &cp->saved);
}

static void ctx_free(waste_ctx *ctx) {
    if (!ctx) return;
    wp_destroy(ctx->pool);
    we_free(&ctx->cache);
    if (ctx->layers) wm_free_state(ctx);
    free(ctx->layers);
    wt_tokenizer_free(ctx->tok);
    wc_close(&ctx->c);
    if (ctx->dir_lock_fd >= 0) close(ctx->dir_lock_fd);
    free(ctx->cpus);
    free(ctx);
}

WASTE_API int32_t waste_open(const char *path, const waste_cfg *cfg_in, waste_ctx **out, char *err, uint64_t cap) {
    if (err && cap) err[0] = 0;
    if (!out) { wu_errf(err, cap, "out must not be NULL"); return WASTE_E_ARG; }
    *out = NULL;
    if (!path) { wu_errf(err, cap, "path must not be NULL"); return WASTE_E_ARG; }
    waste_cfg dflt; waste_cfg_init(&dflt);
    const waste_cfg *cfg = cfg_in ? cfg_in : &dflt;
    int32_t st = check_cfg(cfg, err, cap);
    if (st) return st;
    waste_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    ctx->dir_lock_fd = -1;
    ctx->c.trunk_fd = -1;
    ctx->ctx_tokens = cfg->ctx_tokens ? cfg->ctx_tokens : 4096;
    ctx->prefill_chunk = cfg->prefill_chunk ? cfg->prefill_chunk : 64;
    ctx->verify = cfg->verify != 0;
    ctx->tokenizer_only = cfg->tokenizer_only != 0;
    st = wc_open_manifest(path, &ctx->c, err, cap);
    if (st) goto fail;
    if (cfg->exclusive_open) {
        ctx->dir_lock_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (ctx->dir_lock_fd < 0) { wu_errf(err, cap, "%s: cannot open the directory to lock: %s", path, strerror(errno)); st = WASTE_E_IO; goto fail; }
        if (flock(ctx->dir_lock_fd, LOCK_EX | LOCK_NB) != 0) { wu_errf(err, cap, "%s: container is locked by another process", path); st = WASTE_E_BUSY; goto fail; }
    }
    if (ctx->c.has_tokenizer) {
        st = wt_tokenizer_load(ctx->c.ranks_path, ctx->c.specials_path, &ctx->tok, err, cap);
        if (st) goto fail;
        if (wt_n_base_vocab(ctx->tok) != ctx->c.n_base_vocab) {
            wu_errf(err, cap, "%s: %u base tokens but manifest tokenizer.n_base_vocab says %u", ctx->c.ranks_path,
                    wt_n_base_vocab(ctx->tok), ctx->c.n_base_vocab);
            st = WASTE_E_FORMAT; goto fail;
        }
        if (wt_n_vocab(ctx->tok) > ctx->c.cfg.vocab) {
            wu_errf(err, cap, "tokenizer has %u ids but the model's vocab_size is %u", wt_n_vocab(ctx->tok), ctx->c.cfg.vocab);
            st = WASTE_E_FORMAT; goto fail;
        }
    }
    if (ctx->tokenizer_only) { *out = ctx; return WASTE_OK; }
    st = wm_sizing_compute(&ctx->c, ctx->ctx_tokens, ctx->prefill_chunk, cfg->ram_budget_bytes, &ctx->sizing, err, cap);
    if (st) goto fail;
    st = wc_open_data(&ctx->c, cfg->direct_io, cfg->verify, ctx->io_note, sizeof ctx->io_note, err, cap);
    if (st < 0) goto fail;
    ctx->direct_all = st;
    /* The trunk stays; the O_DIRECT probe buffer was held on top of it, then freed. */
    wx_mem_add(ctx, ctx->c.resident_bytes);
    wx_mem_add(ctx, ctx->c.probe_bytes);
    wx_mem_sub(ctx, ctx->c.probe_bytes);
    st = wm_bind(ctx, err, cap);
    if (st) goto fail;
    uint64_t state_bytes = 0;
    st = wm_alloc_state(ctx, &state_bytes, err, cap);
    wx_mem_add(ctx, state_bytes);
    if (st) goto fail;
    st = we_init(&ctx->cache, ctx->sizing.record, (uint32_t)ctx->sizing.slots, ctx->c.n_banks, ctx->c.cfg.n_experts,
                 cfg->cache_policy, ctx->c.fingerprint);
    if (st) { wu_errf(err, cap, "out of memory for %llu expert slots", (unsigned long long)ctx->sizing.slots); goto fail; }
    wx_mem_add(ctx, ctx->cache.held_bytes);
    /* The hotlist is a hint (wh_load never fails); warming reads real records, so a damaged
     * one fails open exactly as its first use would fail a call. */
    st = wh_set_path(ctx, cfg->usage_path, err, cap);
    if (st) goto fail;
    wh_load(ctx);
    st = we_warm(ctx, err, cap);
    if (st) goto fail;
    uint32_t nt = cfg->n_threads;
    if (cfg->cpu_list) {
        st = parse_cpu_list(cfg->cpu_list, &ctx->cpus, &ctx->n_cpus, err, cap);
        if (st) goto fail;
        if (nt == 0) nt = ctx->n_cpus;
        if (nt > ctx->n_cpus) {
            wu_errf(err, cap, "cfg.n_threads %u exceeds the %u CPUs of cfg.cpu_list", nt, ctx->n_cpus);
            st = WASTE_E_ARG; goto fail;
        }
    }
    if (nt == 0) {
        cpu_set_t set;
        nt = sched_getaffinity(0, sizeof set, &set) == 0 ? (uint32_t)CPU_COUNT(&set) : 1;
        if (nt == 0) nt = 1;
    }
    ctx->n_threads = nt;
    st = wp_create(nt, ctx->cpus, &ctx->pool);
    if (st) { wu_errf(err, cap, "cannot start %u threads", nt); goto fail; }
    ctx->k = wk_select(cfg->kernels, NULL);   /* check_cfg refused a set the CPU lacks */
    wm_reset_state(ctx);
    *out = ctx;
    return WASTE_OK;
fail:
    ctx_free(ctx);
    wu_sanitize(err, cap);   /* the tokenizer formats its details itself */
    return st;
}

/* A close while a call runs (the token callback, another thread) would free what that
 * call is using: it does nothing instead (waste.h). Taking the busy flag also turns a
 * call that starts during the close into E_BUSY until the memory is gone. */
WASTE_API void waste_close(waste_ctx *ctx) {
    if (!ctx) return;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&ctx->busy, &expected, 1)) return;
    ctx_free(ctx);
}

/* ==== call guard =================================================================== */
static int32_t enter(waste_ctx *ctx) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&ctx->busy, &expected, 1)) {
        /* Do not touch ctx->err: the running call owns it. */
        return WASTE_E_BUSY;
    }
    ctx->err[0] = 0;
    return WASTE_OK;
}
static int32_t leave(waste_ctx *ctx, int32_t st) { atomic_store(&ctx->busy, 0); return st; }

#define ENTER(ctx) do { if (!(ctx)) return WASTE_E_ARG; int32_t e_ = enter(ctx); if (e_) return e_; } while (0)

WASTE_API void waste_abort(waste_ctx *ctx) { if (ctx) atomic_store(&ctx->abort_flag, 1); }

WASTE_API const char *waste_last_error(waste_ctx *ctx) {
    if (!ctx) return "ctx is NULL";
    if (atomic_load(&ctx->busy)) return "E_BUSY: another call is running on this ctx";
    return ctx->err;
}

/* For the any-thread calls: sets the detail only when no call is running (a running call
 * owns ctx->err, and waste_last_error then says E_BUSY, which is not empty either). */
static int32_t any_thread_refusal(waste_ctx *ctx, const char *what) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&ctx->busy, &expected, 1)) {
        snprintf(ctx->err, sizeof ctx->err, "%s", what);
        atomic_store(&ctx->busy, 0);
    }
    return WASTE_E_ARG;
}

WASTE_API int32_t waste_get_model_info(waste_ctx *ctx, waste_model_info *info) {
    if (!ctx) return WASTE_E_ARG;
    if (!info) return any_thread_refusal(ctx, "waste_get_model_info: info must not be NULL");
    if (info->struct_size != sizeof *info)
        return any_thread_refusal(ctx, "waste_model_info.struct_size mismatch (call waste_model_info_init)");
    const wc_config *c = &ctx->c.cfg;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    snprintf(info->arch, sizeof info->arch, "%s", ctx->c.arch);
    info->n_layers = c->n_layers; info->n_moe_layers = c->n_moe; info->n_kda_layers = c->n_kda; info->n_mla_layers = c->n_mla;
    info->n_experts = c->n_experts; info->top_k = c->top_k; info->n_shared_experts = c->n_shared;
    info->hidden = c->hidden; info->vocab = c->vocab;
    info->n_base_vocab = ctx->tok ? wt_n_base_vocab(ctx->tok) : 0;
    info->ctx_max = ctx->ctx_tokens;
    info->ctx_train = c->ctx_train > UINT32_MAX ? UINT32_MAX : (uint32_t)c->ctx_train;
    info->params_total = ctx->layers ? wm_params_total(ctx) : 0;
    info->params_active = ctx->layers ? wm_params_active(ctx) : 0;
    info->bos_id = c->bos; info->eos_id = c->eos;
    info->media_placeholder_id = ctx->tok ? wt_special_id(ctx->tok, "<|media_pad|>") : -1;
    info->has_vision = 0;
    info->has_tokenizer = ctx->tok != NULL;
    info->record_bytes = ctx->c.max_record_bytes;
    if (ctx->c.expert_group) snprintf(info->quant, sizeof info->quant, "trunk=%s experts=%sg%u", ctx->c.trunk_fmt, ctx->c.expert_fmt, ctx->c.expert_group);
    else snprintf(info->quant, sizeof info->quant, "trunk=%s experts=%s", ctx->c.trunk_fmt, ctx->c.n_banks ? ctx->c.expert_fmt : "none");
    return WASTE_OK;
}

/* ==== tokenizer ==================================================================== */
static int32_t tokenize_impl(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos, int32_t markup,
                             int32_t *out, uint64_t cap, uint64_t *n_out) {
    ENTER(ctx);
    if ((!text && len) || !n_out || (!out && cap)) { wx_err(ctx, "text, out and n_out must not be NULL"); return leave(ctx, WASTE_E_ARG); }
    *n_out = 0;
    if (!ctx->tok) { wx_err(ctx, "the container has no tokenizer files (tokenizer.tiktoken, specials.json); use token ids"); return leave(ctx, WASTE_E_UNSUPPORTED); }
    uint64_t bad = wt_utf8_invalid_at(text ? text : "", len);
    if (bad != UINT64_MAX) {
        wx_err(ctx, "invalid UTF-8 at byte %llu of %llu", (unsigned long long)bad, (unsigned long long)len);
        return leave(ctx, WASTE_E_ARG);
    }
    uint64_t extra = 0;
    if (add_bos) {
        if (ctx->c.cfg.bos < 0) { wx_err(ctx, "add_bos: the model has no bos_token_id"); return leave(ctx, WASTE_E_ARG); }
        extra = 1;
    }
    uint64_t n = 0;
    int32_t st;
    if (cap < extra) st = wt_tokenize(ctx->tok, text ? text : "", len, markup, NULL, 0, &n);
    else st = wt_tokenize(ctx->tok, text ? text : "", len, markup, out ? out + extra : NULL, cap - extra, &n);
    if (st == WASTE_OK && cap < extra) st = WASTE_E_SPACE;
    *n_out = n + extra;
    if (st == WASTE_E_SPACE) { wx_err(ctx, "output holds %llu ids, %llu needed", (unsigned long long)cap, (unsigned long long)(n + extra)); return leave(ctx, st); }
    if (st) { wx_err(ctx, "tokenize failed (%s)", waste_status_name(st)); return leave(ctx, st); }
    if (extra) out[0] = ctx->c.cfg.bos;
    return leave(ctx, WASTE_OK);
}

WASTE_API int32_t waste_tokenize(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos, int32_t *out, uint64_t cap, uint64_t *n_out) {
    return tokenize_impl(ctx, text, len, add_bos, 0, out, cap, n_out);
}
WASTE_API int32_t waste_tokenize_markup(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos, int32_t *out, uint64_t cap, uint64_t *n_out) {
    return tokenize_impl(ctx, text, len, add_bos, 1, out, cap, n_out);
}

WASTE_API int32_t waste_detokenize(waste_ctx *ctx, const int32_t *ids, uint64_t n, char *out, uint64_t cap, uint64_t *n_out) {
    ENTER(ctx);
    if ((!ids && n) || !n_out || (!out && cap)) { wx_err(ctx, "ids, out and n_out must not be NULL"); return leave(ctx, WASTE_E_ARG); }
    *n_out = 0;
    if (!ctx->tok) { wx_err(ctx, "the container has no tokenizer files; detokenize is unavailable"); return leave(ctx, WASTE_E_UNSUPPORTED); }
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *b; uint64_t bl;
        if (wt_token_bytes(ctx->tok, ids[i], &b, &bl) != 0) {
            wx_err(ctx, "ids[%llu] = %d is not a token id", (unsigned long long)i, ids[i]); return leave(ctx, WASTE_E_ARG);
        }
        if (total + bl <= cap) memcpy(out + total, b, bl);
        total += bl;
    }
    *n_out = total;
    if (total > cap) { wx_err(ctx, "output holds %llu bytes, %llu needed", (unsigned long long)cap, (unsigned long long)total); return leave(ctx, WASTE_E_SPACE); }
    return leave(ctx, WASTE_OK);
}

/* ==== evaluation =================================================================== */
/* engine.md §1 (E_IO, E_FORMAT, E_NOMEM) and §5 (E_BUDGET: no evictable slot). */
static int is_poisoning(int32_t st) {
    return st == WASTE_E_IO || st == WASTE_E_FORMAT || st == WASTE_E_NOMEM || st == WASTE_E_BUDGET;
}

static int32_t check_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n) {
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return WASTE_E_UNSUPPORTED; }
    if (ctx->poisoned) { wx_err(ctx, "ctx is poisoned by an earlier I/O, format, memory or budget failure; call waste_reset"); return WASTE_E_STATE; }
    if (!ids || n == 0) { wx_err(ctx, "n must be >= 1 and ids not NULL"); return WASTE_E_ARG; }
    for (uint64_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= ctx->c.cfg.vocab) {
            wx_err(ctx, "ids[%llu] = %d is outside the vocabulary [0, %u)", (unsigned long long)i, ids[i], ctx->c.cfg.vocab);
            return WASTE_E_ARG;
        }
    if (n > ctx->ctx_tokens || ctx->pos + n > ctx->ctx_tokens) {
        wx_err(ctx, "position %llu + %llu tokens does not fit ctx_tokens %u", (unsigned long long)ctx->pos, (unsigned long long)n, ctx->ctx_tokens);
        return WASTE_E_CTX;
    }
    return WASTE_OK;
}

/* Evaluates ids in chunks; an abort is honoured before each chunk. */
static int32_t run_chunks(waste_ctx *ctx, const int32_t *ids, uint64_t n, uint64_t *done) {
    *done = 0;
    while (*done < n) {
        if (atomic_exchange(&ctx->abort_flag, 0)) { wx_err(ctx, "aborted by waste_abort"); return WASTE_E_CANCELLED; }
        uint64_t m = n - *done < ctx->prefill_chunk ? n - *done : ctx->prefill_chunk;
        int32_t st = wm_forward(ctx, ids + *done, (uint32_t)m, *done + m == n);
        if (st) {
            if (is_poisoning(st)) ctx->poisoned = 1;
            if (!ctx->err[0]) wx_err(ctx, "evaluation failed (%s)", waste_status_name(st));
            return st;
        }
        *done += m;
    }
    return WASTE_OK;
}

WASTE_API int32_t waste_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n, float *logits, uint64_t cap) {
    ENTER(ctx);
    int32_t st = check_eval(ctx, ids, n);
    if (st) return leave(ctx, st);
    if (logits && cap < ctx->c.cfg.vocab) { wx_err(ctx, "logits holds %llu floats, vocab is %u", (unsigned long long)cap, ctx->c.cfg.vocab); return leave(ctx, WASTE_E_SPACE); }
    ctx->call_hits = ctx->call_misses = ctx->call_bytes = 0; ctx->call_io_ms = 0;
    uint64_t done;
    caller_pin cp; pin_caller(ctx, &cp);
    st = run_chunks(ctx, ids, n, &done);
    unpin_caller(&cp);
    if (st) return leave(ctx, st);
    if (logits) memcpy(logits, ctx->logits, (size_t)ctx->c.cfg.vocab * sizeof(float));
    return leave(ctx, WASTE_OK);
}

WASTE_API int32_t waste_reset(waste_ctx *ctx) {
    ENTER(ctx);
    if (!ctx->tokenizer_only) wm_reset_state(ctx);
    ctx->poisoned = 0;
    atomic_store(&ctx->abort_flag, 0);
    return leave(ctx, WASTE_OK);
}

WASTE_API uint64_t waste_position(waste_ctx *ctx) { return ctx ? ctx->pos : 0; }

/* ==== pieces: UTF-8 hold-back ====================================================== */
typedef struct { uint8_t hold[4]; uint32_t n_hold; uint8_t *buf; uint64_t cap; } piece_state;

/* Length of a valid-but-incomplete UTF-8 sequence at the end of p[0..n), else 0. */
static uint32_t incomplete_tail(const uint8_t *p, uint64_t n) {
    for (uint32_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t b = p[n - back];
        if ((b & 0xC0) == 0x80) continue;
        uint32_t need = (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
        if (need <= back) return 0;
        if (back >= 2) {
            uint8_t c = p[n - back + 1];
            uint8_t lo = 0x80, hi = 0xBF;
            if (b == 0xE0) lo = 0xA0; else if (b == 0xED) hi = 0x9F; else if (b == 0xF0) lo = 0x90; else if (b == 0xF4) hi = 0x8F;
            if (c < lo || c > hi) return 0;
        }
        return back;
    }
    return 0;
}

static int32_t make_piece(waste_ctx *ctx, piece_state *ps, int32_t tok, int flush, const char **out, uint32_t *out_len) {
    *out = ""; *out_len = 0;
    if (!ctx->tok) return WASTE_OK;
    const uint8_t *b; uint64_t bl;
    /* An id the model can sample but the tokenizer has no text for (a padding row of the
     * embedding, or a gap between special ids) has an empty piece, as detokenize refuses it;
     * waste.h documents this at waste_token_info.piece. */
    if (wt_token_bytes(ctx->tok, tok, &b, &bl) != 0) { b = (const uint8_t *)""; bl = 0; }
    uint64_t need = ps->n_hold + bl + 1;
    if (need > ps->cap) {
        uint8_t *nb = realloc(ps->buf, need);
        if (!nb) return WASTE_E_NOMEM;
        wx_mem_add(ctx, need - ps->cap);
        ps->buf = nb; ps->cap = need;
    }
    memcpy(ps->buf, ps->hold, ps->n_hold);
    memcpy(ps->buf + ps->n_hold, b, bl);
    uint64_t n = ps->n_hold + bl;
    int special = ctx->tok && (uint32_t)tok >= wt_n_base_vocab(ctx->tok);
    uint32_t keep = (flush || special) ? 0 : incomplete_tail(ps->buf, n);
    memcpy(ps->hold, ps->buf + n - keep, keep);
    ps->n_hold = keep;
    ps->buf[n - keep] = 0;
    *out = (const char *)ps->buf; *out_len = (uint32_t)(n - keep);
    return WASTE_OK;
}

/* ==== generation =================================================================== */
static int32_t check_params(waste_ctx *ctx, const waste_gen_params *p) {
    if (!p) { wx_err(ctx, "params must not be NULL"); return WASTE_E_ARG; }
    if (p->struct_size != sizeof *p) { wx_err(ctx, "waste_gen_params.struct_size mismatch (call waste_gen_params_init)"); return WASTE_E_ARG; }
    if (!(p->temperature >= 0.0f) || isinf(p->temperature)) { wx_err(ctx, "params.temperature must be a finite number >= 0"); return WASTE_E_ARG; }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) { wx_err(ctx, "params.top_p must be in (0, 1]"); return WASTE_E_ARG; }
    if (p->n_stop_ids && !p->stop_ids) { wx_err(ctx, "params.stop_ids is NULL but n_stop_ids is %u", p->n_stop_ids); return WASTE_E_ARG; }
    return WASTE_OK;
}

WASTE_API int32_t waste_generate(waste_ctx *ctx, const int32_t *prompt, uint64_t n, const waste_gen_params *params,
                                 waste_token_cb cb, void *user, waste_gen_result *res) {
    ENTER(ctx);
    if (res && res->struct_size != sizeof *res) { wx_err(ctx, "waste_gen_result.struct_size mismatch (call waste_gen_result_init)"); return leave(ctx, WASTE_E_ARG); }
    int32_t st = check_params(ctx, params);
    if (!st) st = check_eval(ctx, prompt, n);
    if (st) return leave(ctx, st);
    waste_gen_result r; memset(&r, 0, sizeof r); r.struct_size = sizeof r;
    r.direct_io = ctx->direct_all;
    piece_state ps; memset(&ps, 0, sizeof ps);
    ws_rng rng; ws_seed(&rng, params->seed);
    ctx->call_hits = ctx->call_misses = ctx->call_bytes = 0; ctx->call_io_ms = 0;
    double t0 = wu_now_ms();
    uint64_t done = 0;
    caller_pin cp; pin_caller(ctx, &cp);
    st = run_chunks(ctx, prompt, n, &done);
    r.prompt_tokens = (uint32_t)done;
    r.prefill_ms = wu_now_ms() - t0;
    double pass_start = t0;
    for (uint32_t idx = 0; st == WASTE_OK; idx++) {
        float lp;
        int32_t tok = ws_sample(ctx, ctx->logits, ctx->c.cfg.vocab, params, &rng, &lp);
        int is_stop = 0;
        for (uint32_t i = 0; i < params->n_stop_ids; i++) if (params->stop_ids[i] == tok) is_stop = 1;
        int max_hit = params->max_tokens && idx + 1 >= params->max_tokens;
        int ctx_full = ctx->pos + 1 > ctx->ctx_tokens;
        waste_token_info info; memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        info.index = idx; info.token = tok; info.is_stop = is_stop; info.logprob = lp;
        info.experts_hit = (uint32_t)ctx->call_hits; info.experts_missed = (uint32_t)ctx->call_misses;
        info.bytes_read = ctx->call_bytes; info.io_ms = ctx->call_io_ms;
        info.ms = wu_now_ms() - pass_start;
        r.experts_hit += ctx->call_hits; r.experts_missed += ctx->call_misses; r.bytes_read += ctx->call_bytes;
        ctx->call_hits = ctx->call_misses = ctx->call_bytes = 0; ctx->call_io_ms = 0;
        const char *piece; uint32_t plen;
        if (make_piece(ctx, &ps, tok, is_stop || max_hit || ctx_full, &piece, &plen)) {
            wx_err(ctx, "out of memory for the piece of generated token %u", idx);
            st = WASTE_E_NOMEM; ctx->poisoned = 1; break;
        }
        info.piece = piece; info.piece_len = plen;
        int32_t stop_cb = cb ? cb(&info, user) : 0;
        r.tokens_generated = idx + 1;
        if (is_stop) { r.stop_reason = WASTE_STOP_TOKEN; break; }
        if (stop_cb) { r.stop_reason = WASTE_STOP_CALLBACK; break; }
        if (max_hit) { r.stop_reason = WASTE_STOP_MAX_TOKENS; break; }
        if (ctx_full) { r.stop_reason = WASTE_STOP_CTX_FULL; break; }
        if (atomic_exchange(&ctx->abort_flag, 0)) { wx_err(ctx, "aborted by waste_abort"); st = WASTE_E_CANCELLED; break; }
        pass_start = wu_now_ms();
        st = wm_forward(ctx, &tok, 1, 1);
        if (st) {
            if (is_poisoning(st)) ctx->poisoned = 1;
            if (!ctx->err[0]) wx_err(ctx, "evaluation failed (%s)", waste_status_name(st));
        }
    }
    unpin_caller(&cp);
    /* Bytes still held (no final flush: callback stop, abort, error) go to the result. */
    memcpy(r.tail, ps.hold, ps.n_hold);
    r.tail_len = ps.n_hold;
    free(ps.buf);
    wx_mem_sub(ctx, ps.cap);
    r.decode_ms = wu_now_ms() - t0 - r.prefill_ms;
    if (res) *res = r;
    return leave(ctx, st);
}

/* ==== statistics =================================================================== */
WASTE_API int32_t waste_get_stats(waste_ctx *ctx, waste_stats *s) {
    if (!ctx) return WASTE_E_ARG;
    if (!s) return any_thread_refusal(ctx, "waste_get_stats: stats must not be NULL");
    if (s->struct_size != sizeof *s) return any_thread_refusal(ctx, "waste_stats.struct_size mismatch (call waste_stats_init)");
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    s->tokens = atomic_load(&ctx->st_tokens);
    s->hits = atomic_load(&ctx->st_hits);
    s->misses = atomic_load(&ctx->st_misses);
    s->reads = atomic_load(&ctx->st_reads);
    s->bytes_read = atomic_load(&ctx->st_bytes);
    s->compute_s = (double)atomic_load(&ctx->st_compute_us) / 1e6;
    s->io_s = (double)atomic_load(&ctx->st_io_us) / 1e6;
    s->direct_io = ctx->direct_all;
    snprintf(s->io_note, sizeof s->io_note, "%s", ctx->io_note);
    s->budget_bytes = ctx->sizing.budget;
    s->allocated_bytes = atomic_load(&ctx->mem_now);
    s->peak_bytes = atomic_load(&ctx->mem_peak);
    s->warm_bytes = atomic_load(&ctx->st_warm_bytes);
    s->warm_slots = ctx->warm_slots;
    s->usage_entries = ctx->usage_entries;
    s->usage_skipped = ctx->usage_skipped;
    snprintf(s->usage_note, sizeof s->usage_note, "%s", ctx->usage_note);
    s->slots_total = ctx->cache.n_slots;
    s->slots_used = ctx->cache.used;
    return WASTE_OK;
}

/* ==== snapshots (docs/FORMAT.md §7) ================================================ */
static uint64_t layer_state_floats(const waste_ctx *ctx, uint32_t l, uint64_t pos) {
    const wc_config *c = &ctx->c.cfg;
    uint64_t hd = (uint64_t)c->kda_heads * c->kda_dim;
    if (c->is_mla[l]) return pos * (c->kv_rank + c->d_rope);
    return 3 * hd * (c->conv_k - 1) + (uint64_t)c->kda_heads * c->kda_dim * c->kda_dim;
}

static uint64_t snapshot_bytes(const waste_ctx *ctx, uint64_t pos) {
    uint64_t n = 32 + 4 * pos + 4;
    for (uint32_t l = 0; l < ctx->c.cfg.n_layers; l++) n += 4 * layer_state_floats(ctx, l, pos);
    return n;
}

WASTE_API int32_t waste_snapshot_size(waste_ctx *ctx, uint64_t *size) {
    ENTER(ctx);
    if (!size) { wx_err(ctx, "size must not be NULL"); return leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return leave(ctx, WASTE_E_UNSUPPORTED); }
    *size = snapshot_bytes(ctx, ctx->pos);
    return leave(ctx, WASTE_OK);
}

WASTE_API int32_t waste_snapshot_save(waste_ctx *ctx, void *buf, uint64_t cap, uint64_t *n_out) {
    ENTER(ctx);
    if (!n_out || (!buf && cap)) { wx_err(ctx, "buf and n_out must not be NULL"); return leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return leave(ctx, WASTE_E_UNSUPPORTED); }
    if (ctx->poisoned) { wx_err(ctx, "ctx is poisoned by an earlier I/O, format, memory or budget failure; call waste_reset"); return leave(ctx, WASTE_E_STATE); }
    uint64_t need = snapshot_bytes(ctx, ctx->pos);
    *n_out = need;
    if (cap < need) { wx_err(ctx, "snapshot needs %llu bytes, buffer holds %llu", (unsigned long long)need, (unsigned long long)cap); return leave(ctx, WASTE_E_SPACE); }
    uint8_t *p = buf;
    memcpy(p, "WSTSNAP1", 8);
    wu_write_u32le(p + 8, 1);
    wu_write_u32le(p + 12, ctx->c.cfg.n_layers);
    wu_write_u64le(p + 16, ctx->c.fingerprint);
    wu_write_u64le(p + 24, ctx->pos);
    uint64_t at = 32;
    memcpy(p + at, ctx->ids, 4 * ctx->pos); at += 4 * ctx->pos;
    const wc_config *c = &ctx->c.cfg;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (c->is_mla[l]) {
            uint64_t nb = 4 * layer_state_floats(ctx, l, ctx->pos);
            memcpy(p + at, ctx->lat[l], nb); at += nb;
        } else {
            uint64_t hd = (uint64_t)c->kda_heads * c->kda_dim, nc = 4 * 3 * hd * (c->conv_k - 1);
            uint64_t ns = 4ull * c->kda_heads * c->kda_dim * c->kda_dim;
            memcpy(p + at, ctx->conv[l], nc); at += nc;
            memcpy(p + at, ctx->S[l], ns); at += ns;
        }
    }
    wu_write_u32le(p + at, wu_crc32(p, at));
    return leave(ctx, WASTE_OK);
}

WASTE_API int32_t waste_snapshot_load(waste_ctx *ctx, const void *buf, uint64_t len) {
    ENTER(ctx);
    if (!buf) { wx_err(ctx, "buf must not be NULL"); return leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return leave(ctx, WASTE_E_UNSUPPORTED); }
    /* Only waste_reset clears poison (engine.md §1): a restore is not a way around it. */
    if (ctx->poisoned) { wx_err(ctx, "ctx is poisoned by an earlier I/O, format, memory or budget failure; call waste_reset"); return leave(ctx, WASTE_E_STATE); }
    const uint8_t *p = buf;
    if (len < 36 || memcmp(p, "WSTSNAP1", 8)) { wx_err(ctx, "snapshot: bad magic or too short"); return leave(ctx, WASTE_E_FORMAT); }
    if (wu_read_u32le(p + 8) != 1) { wx_err(ctx, "snapshot: version %u unsupported", wu_read_u32le(p + 8)); return leave(ctx, WASTE_E_FORMAT); }
    if (wu_read_u32le(p + 12) != ctx->c.cfg.n_layers || wu_read_u64le(p + 16) != ctx->c.fingerprint) {
        wx_err(ctx, "snapshot: taken from a different model (fingerprint or layer count differs)"); return leave(ctx, WASTE_E_FORMAT);
    }
    uint64_t pos = wu_read_u64le(p + 24);
    if (pos > ctx->ctx_tokens) { wx_err(ctx, "snapshot: position %llu exceeds ctx_tokens %u", (unsigned long long)pos, ctx->ctx_tokens); return leave(ctx, WASTE_E_FORMAT); }
    uint64_t need = snapshot_bytes(ctx, pos);
    if (len != need) { wx_err(ctx, "snapshot: %llu bytes, expected %llu", (unsigned long long)len, (unsigned long long)need); return leave(ctx, WASTE_E_FORMAT); }
    if (wu_read_u32le(p + len - 4) != wu_crc32(p, len - 4)) { wx_err(ctx, "snapshot: crc32 mismatch"); return leave(ctx, WASTE_E_FORMAT); }
    for (uint64_t i = 0; i < pos; i++) {
        int32_t id = (int32_t)wu_read_u32le(p + 32 + 4 * i);
        if (id < 0 || (uint32_t)id >= ctx->c.cfg.vocab) { wx_err(ctx, "snapshot: token %llu out of range", (unsigned long long)i); return leave(ctx, WASTE_E_FORMAT); }
    }
    /* Validated: now restore. */
    const wc_config *c = &ctx->c.cfg;
    memcpy(ctx->ids, p + 32, 4 * pos);
    uint64_t at = 32 + 4 * pos;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (c->is_mla[l]) {
            uint64_t nb = 4 * layer_state_floats(ctx, l, pos);
            memcpy(ctx->lat[l], p + at, nb); at += nb;
        } else {
            uint64_t hd = (uint64_t)c->kda_heads * c->kda_dim, nc = 4 * 3 * hd * (c->conv_k - 1);
            uint64_t ns = 4ull * c->kda_heads * c->kda_dim * c->kda_dim;
            memcpy(ctx->conv[l], p + at, nc); at += nc;
            memcpy(ctx->S[l], p + at, ns); at += ns;
        }
    }
    ctx->pos = pos;
    ctx->has_logits = 0;
    return leave(ctx, WASTE_OK);
}

/* ==== hotlist ====================================================================== */
WASTE_API int32_t waste_save_usage(waste_ctx *ctx, const char *path) {
    ENTER(ctx);
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only: it counts no expert use"); return leave(ctx, WASTE_E_UNSUPPORTED); }
    if (path && !path[0]) { wx_err(ctx, "path is empty (pass NULL for the ctx's usage_path)"); return leave(ctx, WASTE_E_ARG); }
    if (!path && !ctx->usage_path[0]) return leave(ctx, WASTE_OK);   /* cfg.usage_path "": no usage file */
    return leave(ctx, wh_save(ctx, path ? path : ctx->usage_path));
}

/* ==== not yet implemented ========================================================== */
WASTE_API int32_t waste_image_add(waste_ctx *ctx, const void *rgb, uint32_t w, uint32_t h, uint32_t *n_pos) {
    (void)rgb; (void)w; (void)h;
    ENTER(ctx);
    if (n_pos) *n_pos = 0;
    wx_err(ctx, "image_add: vision is not supported by this engine yet (cfg.vision)");
    return leave(ctx, WASTE_E_UNSUPPORTED);
}

WASTE_API int32_t waste_image_expand(waste_ctx *ctx, const int32_t *in, uint64_t n, int32_t *out, uint64_t cap, uint64_t *n_out) {
    (void)in; (void)n; (void)out; (void)cap;
    ENTER(ctx);
    if (n_out) *n_out = 0;
    wx_err(ctx, "image_expand: vision is not supported by this engine yet (cfg.vision)");
    return leave(ctx, WASTE_E_UNSUPPORTED);
}

WASTE_API int32_t waste_image_clear(waste_ctx *ctx) {
    ENTER(ctx);
    wx_err(ctx, "image_clear: vision is not supported by this engine yet (cfg.vision)");
    return leave(ctx, WASTE_E_UNSUPPORTED);
}
