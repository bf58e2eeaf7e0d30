/* open.c — the life of a context (open.h): the memory plan, open in order with every
 * allocation counted against the budget, and the teardown that undoes it. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "context.h"
#include "engine.h"
#include "open.h"
#include "sysinfo.h"
#include "tokenizer.h"

int32_t wo_plan(const char *path, const waste_cfg *cfg, waste_plan *plan, char *err, uint64_t cap) {
    wc_container *c = calloc(1, sizeof *c);
    if (!c) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    int32_t st = wc_open_manifest(path, c, err, cap);
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

void wo_free(waste_ctx *ctx) {
    if (!ctx) return;
    wp_destroy(ctx->pool);
    wi_close(ctx->io);               /* lands every queued read before the slots are freed */
    we_free(&ctx->cache);
    if (ctx->layers) wm_free_state(ctx);
    free(ctx->layers);
    wt_tokenizer_free(ctx->tok);
    wc_close(&ctx->c);
    if (ctx->dir_lock_fd >= 0) close(ctx->dir_lock_fd);
    free(ctx->cpus);
    free(ctx);
}

int32_t wo_open(const char *path, const waste_cfg *cfg, waste_ctx **out, char *err, uint64_t cap) {
    waste_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    ctx->dir_lock_fd = -1;
    ctx->c.trunk_fd = -1;
    ctx->ctx_tokens = cfg->ctx_tokens ? cfg->ctx_tokens : 4096;
    ctx->prefill_chunk = cfg->prefill_chunk ? cfg->prefill_chunk : 64;
    ctx->verify = cfg->verify != 0;
    ctx->tokenizer_only = cfg->tokenizer_only != 0;
    int32_t st = wc_open_manifest(path, &ctx->c, err, cap);
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
    /* The hotlist is a hint (wh_load never fails); warming skips a damaged record with a
     * note (waste_stats.usage_note), and its first use fails the call that needs it. */
    st = wh_set_path(ctx, cfg->usage_path, err, cap);
    if (st) goto fail;
    wh_load(ctx);
    st = we_warm(ctx, err, cap);
    if (st) goto fail;
    uint32_t nt = cfg->n_threads;
    if (cfg->cpu_list) {
        st = wsys_parse_cpu_list(cfg->cpu_list, &ctx->cpus, &ctx->n_cpus, err, cap);
        if (st) goto fail;
        if (nt == 0) nt = ctx->n_cpus;
        if (nt > ctx->n_cpus) {
            wu_errf(err, cap, "cfg.n_threads %u exceeds the %u CPUs of cfg.cpu_list", nt, ctx->n_cpus);
            st = WASTE_E_ARG; goto fail;
        }
    }
    if (nt == 0) nt = wsys_cpus_available();
    ctx->n_threads = nt;
    st = wp_create(nt, ctx->cpus, &ctx->pool);
    if (st) { wu_errf(err, cap, "cannot start %u threads", nt); goto fail; }
    if (cfg->io_threads) {
        st = wi_open(cfg->io_threads, NULL, &ctx->io);
        if (st) { wu_errf(err, cap, "cannot start %u reader threads", cfg->io_threads); goto fail; }
    }
    ctx->io_threads = cfg->io_threads;
    ctx->lookahead = cfg->lookahead;
    ctx->act_q8 = cfg->activations == WASTE_ACT_Q8;
    ctx->k = wk_select(cfg->kernels, NULL);   /* api.c's check_cfg refused a set the CPU lacks */
    wm_reset_state(ctx);
    *out = ctx;
    return WASTE_OK;
fail:
    wo_free(ctx);
    wu_sanitize(err, cap);   /* the tokenizer formats its details itself */
    return st;
}

