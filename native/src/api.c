/* api.c — the public functions of waste.h: argument checks, the busy guard and dispatch to
 * the components (open.c, session.c, snapshot.c, the tokenizer, hotlist.c), plus static
 * information, struct init, statistics and the abort/poison rules (docs/ENGINE.md §1–2).
 * Nothing else in the library calls a waste_* function; native/README.md draws the layers. */
#include <fcntl.h>   /* O_DIRECT, for the build information */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "context.h"
#include "engine.h"
#include "open.h"
#include "session.h"
#include "snapshot.h"
#include "sysinfo.h"
#include "tokenizer.h"

/* The detail of every call refused on a poisoned ctx (docs/ENGINE.md §1). */
static const char POISONED[] = "ctx is poisoned by an earlier I/O, format, memory or budget failure; call waste_reset";

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

WASTE_API const char *waste_status_name(int32_t s) { return wx_status_name(s); }

WASTE_API uint64_t waste_usable_ram(void) { return wsys_usable_ram(); }

/* ==== struct init ================================================================== */
WASTE_API void waste_cfg_init(waste_cfg *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->cache_policy = WASTE_CACHE_LAYER;
    c->direct_io = 1;
}
WASTE_API void waste_plan_init(waste_plan *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }
WASTE_API void waste_model_info_init(waste_model_info *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }
WASTE_API void waste_gen_params_init(waste_gen_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}
WASTE_API void waste_gen_result_init(waste_gen_result *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }
WASTE_API void waste_stats_init(waste_stats *p) { if (p) { memset(p, 0, sizeof *p); p->struct_size = sizeof *p; } }

/* ==== plan and open ================================================================ */
static int32_t check_cfg(const waste_cfg *cfg, char *err, uint64_t cap) {
    if (!cfg) return WASTE_OK;
    if (cfg->struct_size != sizeof(waste_cfg)) {
        wu_errf(err, cap, "waste_cfg.struct_size is %u, expected %u (call waste_cfg_init)", cfg->struct_size, (unsigned)sizeof(waste_cfg));
        return WASTE_E_ARG;
    }
    if (cfg->cache_policy != WASTE_CACHE_LFRU && cfg->cache_policy != WASTE_CACHE_LRU && cfg->cache_policy != WASTE_CACHE_LAYER) { wu_errf(err, cap, "cfg.cache_policy %d unknown", cfg->cache_policy); return WASTE_E_ARG; }
    if (cfg->kernels < WASTE_KERNELS_AUTO || cfg->kernels > WASTE_KERNELS_AVX512) { wu_errf(err, cap, "cfg.kernels %d unknown (0 auto, 1 generic, 2 avx2, 3 avx512)", cfg->kernels); return WASTE_E_ARG; }
    const char *why = NULL;
    if (!wk_select(cfg->kernels, &why)) {
        wu_errf(err, cap, "cfg.kernels %d (%s): %s", cfg->kernels, cfg->kernels == WASTE_KERNELS_AVX2 ? "avx2" : "avx512", why);
        return WASTE_E_UNSUPPORTED;
    }
    if (cfg->activations != WASTE_ACT_F32 && cfg->activations != WASTE_ACT_Q8) { wu_errf(err, cap, "cfg.activations %d unknown (0 f32, 1 q8)", cfg->activations); return WASTE_E_ARG; }
    if (cfg->ctx_tokens > (1u << 24)) { wu_errf(err, cap, "cfg.ctx_tokens %u above 16777216", cfg->ctx_tokens); return WASTE_E_ARG; }
    if (cfg->n_threads > 1024) { wu_errf(err, cap, "cfg.n_threads %u above 1024", cfg->n_threads); return WASTE_E_ARG; }
    if (cfg->prefill_chunk > 4096) { wu_errf(err, cap, "cfg.prefill_chunk %u above 4096", cfg->prefill_chunk); return WASTE_E_ARG; }
    if (cfg->io_threads > 64) { wu_errf(err, cap, "cfg.io_threads %u above 64", cfg->io_threads); return WASTE_E_ARG; }
    if (cfg->lookahead > 1) { wu_errf(err, cap, "cfg.lookahead %u: only 1 (the next MoE layer) is supported", cfg->lookahead); return WASTE_E_ARG; }
    if (cfg->lookahead && !cfg->io_threads) { wu_errf(err, cap, "cfg.lookahead needs cfg.io_threads >= 1 (guesses are read in the background)"); return WASTE_E_ARG; }
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
    return wo_plan(path, cfg, plan, err, cap);
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
    return wo_open(path, cfg, out, err, cap);
}

/* A close while a call runs (the token callback, another thread) would free what that
 * call is using: it does nothing instead (waste.h). Taking the busy flag also turns a
 * call that starts during the close into E_BUSY until the memory is gone. */
WASTE_API void waste_close(waste_ctx *ctx) {
    if (!ctx || !wx_claim(ctx)) return;
    wo_free(ctx);
}

/* ==== any-thread calls ============================================================= */
WASTE_API void waste_abort(waste_ctx *ctx) { if (ctx) atomic_store(&ctx->abort_flag, 1); }

WASTE_API const char *waste_last_error(waste_ctx *ctx) {
    if (!ctx) return "ctx is NULL";
    if (wx_is_busy(ctx)) return "E_BUSY: another call is running on this ctx";
    return ctx->err;
}

WASTE_API int32_t waste_get_model_info(waste_ctx *ctx, waste_model_info *info) {
    if (!ctx) return WASTE_E_ARG;
    if (!info) return wx_refuse_any_thread(ctx, "waste_get_model_info: info must not be NULL");
    if (info->struct_size != sizeof *info)
        return wx_refuse_any_thread(ctx, "waste_model_info.struct_size mismatch (call waste_model_info_init)");
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
    WX_ENTER(ctx);
    if ((!text && len) || !n_out || (!out && cap)) { wx_err(ctx, "text, out and n_out must not be NULL"); return wx_leave(ctx, WASTE_E_ARG); }
    *n_out = 0;
    if (!ctx->tok) { wx_err(ctx, "the container has no tokenizer files (tokenizer.tiktoken, specials.json); use token ids"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    uint64_t bad = wt_utf8_invalid_at(text ? text : "", len);
    if (bad != UINT64_MAX) {
        wx_err(ctx, "invalid UTF-8 at byte %llu of %llu", (unsigned long long)bad, (unsigned long long)len);
        return wx_leave(ctx, WASTE_E_ARG);
    }
    uint64_t extra = 0;
    if (add_bos) {
        if (ctx->c.cfg.bos < 0) { wx_err(ctx, "add_bos: the model has no bos_token_id"); return wx_leave(ctx, WASTE_E_ARG); }
        extra = 1;
    }
    uint64_t n = 0;
    int32_t st;
    if (cap < extra) st = wt_tokenize(ctx->tok, text ? text : "", len, markup, NULL, 0, &n);
    else st = wt_tokenize(ctx->tok, text ? text : "", len, markup, out ? out + extra : NULL, cap - extra, &n);
    if (st == WASTE_OK && cap < extra) st = WASTE_E_SPACE;
    *n_out = n + extra;
    if (st == WASTE_E_SPACE) { wx_err(ctx, "output holds %llu ids, %llu needed", (unsigned long long)cap, (unsigned long long)(n + extra)); return wx_leave(ctx, st); }
    if (st) { wx_err(ctx, "tokenize failed (%s)", wx_status_name(st)); return wx_leave(ctx, st); }
    if (extra) out[0] = ctx->c.cfg.bos;
    return wx_leave(ctx, WASTE_OK);
}

WASTE_API int32_t waste_tokenize(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos, int32_t *out, uint64_t cap, uint64_t *n_out) {
    return tokenize_impl(ctx, text, len, add_bos, 0, out, cap, n_out);
}
WASTE_API int32_t waste_tokenize_markup(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos, int32_t *out, uint64_t cap, uint64_t *n_out) {
    return tokenize_impl(ctx, text, len, add_bos, 1, out, cap, n_out);
}

WASTE_API int32_t waste_detokenize(waste_ctx *ctx, const int32_t *ids, uint64_t n, char *out, uint64_t cap, uint64_t *n_out) {
    WX_ENTER(ctx);
    if ((!ids && n) || !n_out || (!out && cap)) { wx_err(ctx, "ids, out and n_out must not be NULL"); return wx_leave(ctx, WASTE_E_ARG); }
    *n_out = 0;
    if (!ctx->tok) { wx_err(ctx, "the container has no tokenizer files; detokenize is unavailable"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *b; uint64_t bl;
        if (wt_token_bytes(ctx->tok, ids[i], &b, &bl) != 0) {
            wx_err(ctx, "ids[%llu] = %d is not a token id", (unsigned long long)i, ids[i]); return wx_leave(ctx, WASTE_E_ARG);
        }
        if (total + bl <= cap) memcpy(out + total, b, bl);
        total += bl;
    }
    *n_out = total;
    if (total > cap) { wx_err(ctx, "output holds %llu bytes, %llu needed", (unsigned long long)cap, (unsigned long long)total); return wx_leave(ctx, WASTE_E_SPACE); }
    return wx_leave(ctx, WASTE_OK);
}

/* ==== evaluation =================================================================== */
static int32_t check_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n) {
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return WASTE_E_UNSUPPORTED; }
    if (ctx->poisoned) { wx_err(ctx, "%s", POISONED); return WASTE_E_STATE; }
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

WASTE_API int32_t waste_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n, float *logits, uint64_t cap) {
    WX_ENTER(ctx);
    int32_t st = check_eval(ctx, ids, n);
    if (st) return wx_leave(ctx, st);
    if (logits && cap < ctx->c.cfg.vocab) { wx_err(ctx, "logits holds %llu floats, vocab is %u", (unsigned long long)cap, ctx->c.cfg.vocab); return wx_leave(ctx, WASTE_E_SPACE); }
    return wx_leave(ctx, wg_eval(ctx, ids, n, logits));
}

WASTE_API int32_t waste_reset(waste_ctx *ctx) {
    WX_ENTER(ctx);
    if (!ctx->tokenizer_only) wm_reset_state(ctx);
    ctx->poisoned = 0;
    atomic_store(&ctx->abort_flag, 0);
    return wx_leave(ctx, WASTE_OK);
}

WASTE_API uint64_t waste_position(waste_ctx *ctx) { return ctx ? ctx->pos : 0; }

/* ==== generation =================================================================== */
static int32_t check_params(waste_ctx *ctx, const waste_gen_params *p) {
    if (!p) { wx_err(ctx, "params must not be NULL"); return WASTE_E_ARG; }
    if (p->struct_size != sizeof *p) { wx_err(ctx, "waste_gen_params.struct_size mismatch (call waste_gen_params_init)"); return WASTE_E_ARG; }
    if (!(p->temperature >= 0.0f) || isinf(p->temperature)) { wx_err(ctx, "params.temperature must be a finite number >= 0"); return WASTE_E_ARG; }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) { wx_err(ctx, "params.top_p must be in (0, 1]"); return WASTE_E_ARG; }
    if (p->n_stop_ids && !p->stop_ids) { wx_err(ctx, "params.stop_ids is NULL but n_stop_ids is %u", p->n_stop_ids); return WASTE_E_ARG; }
    if (p->n_top_logprobs > WASTE_MAX_TOP_LOGPROBS) { wx_err(ctx, "params.n_top_logprobs must be at most %d, not %u", WASTE_MAX_TOP_LOGPROBS, p->n_top_logprobs); return WASTE_E_ARG; }
    if (p->n_logit_bias && (!p->logit_bias_ids || !p->logit_bias)) { wx_err(ctx, "params.logit_bias_ids or logit_bias is NULL but n_logit_bias is %u", p->n_logit_bias); return WASTE_E_ARG; }
    for (uint32_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0 || (uint32_t)p->logit_bias_ids[i] >= ctx->c.cfg.vocab) {
            wx_err(ctx, "params.logit_bias_ids[%u] = %d is outside the vocabulary", i, p->logit_bias_ids[i]); return WASTE_E_ARG;
        }
        if (!isfinite(p->logit_bias[i])) { wx_err(ctx, "params.logit_bias[%u] must be finite", i); return WASTE_E_ARG; }
    }
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty)) { wx_err(ctx, "params.presence_penalty and frequency_penalty must be finite"); return WASTE_E_ARG; }
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty)) { wx_err(ctx, "params.repetition_penalty must be a finite number > 0"); return WASTE_E_ARG; }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) { wx_err(ctx, "params.min_p must be in [0, 1]"); return WASTE_E_ARG; }
    return WASTE_OK;
}

WASTE_API int32_t waste_generate(waste_ctx *ctx, const int32_t *prompt, uint64_t n, const waste_gen_params *params,
                                 waste_token_cb cb, void *user, waste_gen_result *res) {
    WX_ENTER(ctx);
    if (res && res->struct_size != sizeof *res) { wx_err(ctx, "waste_gen_result.struct_size mismatch (call waste_gen_result_init)"); return wx_leave(ctx, WASTE_E_ARG); }
    int32_t st = check_params(ctx, params);
    if (!st) st = check_eval(ctx, prompt, n);
    if (st) return wx_leave(ctx, st);
    return wx_leave(ctx, wg_generate(ctx, prompt, n, params, cb, user, res));
}

/* ==== statistics =================================================================== */
WASTE_API int32_t waste_get_stats(waste_ctx *ctx, waste_stats *s) {
    if (!ctx) return WASTE_E_ARG;
    if (!s) return wx_refuse_any_thread(ctx, "waste_get_stats: stats must not be NULL");
    if (s->struct_size != sizeof *s) return wx_refuse_any_thread(ctx, "waste_stats.struct_size mismatch (call waste_stats_init)");
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
    s->io_threads = ctx->io_threads;
    s->lookahead = ctx->lookahead;
    s->activations = ctx->act_q8 ? WASTE_ACT_Q8 : WASTE_ACT_F32;
    s->guesses = atomic_load(&ctx->st_guesses);
    s->guess_hits = atomic_load(&ctx->st_guess_hits);
    s->wasted_bytes = atomic_load(&ctx->st_wasted_bytes);
    s->io_wait_s = (double)atomic_load(&ctx->st_wait_us) / 1e6;
    if (ctx->io) {
        uint32_t depth; uint64_t busy, read_us;
        wi_stats(ctx->io, &depth, &busy, &read_us);
        s->queue_depth_max = depth;
        s->disk_busy_s = (double)busy / 1e6;
    } else {
        s->queue_depth_max = s->reads ? 1 : 0;
        s->disk_busy_s = s->io_s;
    }
    return WASTE_OK;
}

/* ==== snapshots (snapshot.c) ======================================================= */
WASTE_API int32_t waste_snapshot_size(waste_ctx *ctx, uint64_t *size) {
    WX_ENTER(ctx);
    if (!size) { wx_err(ctx, "size must not be NULL"); return wx_leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    *size = wsnap_size(ctx);
    return wx_leave(ctx, WASTE_OK);
}

WASTE_API int32_t waste_snapshot_save(waste_ctx *ctx, void *buf, uint64_t cap, uint64_t *n_out) {
    WX_ENTER(ctx);
    if (!n_out || (!buf && cap)) { wx_err(ctx, "buf and n_out must not be NULL"); return wx_leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    if (ctx->poisoned) { wx_err(ctx, "%s", POISONED); return wx_leave(ctx, WASTE_E_STATE); }
    return wx_leave(ctx, wsnap_save(ctx, buf, cap, n_out));
}

WASTE_API int32_t waste_snapshot_load(waste_ctx *ctx, const void *buf, uint64_t len) {
    WX_ENTER(ctx);
    if (!buf) { wx_err(ctx, "buf must not be NULL"); return wx_leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    /* Only waste_reset clears poison (docs/ENGINE.md §1): a restore is not a way around it. */
    if (ctx->poisoned) { wx_err(ctx, "%s", POISONED); return wx_leave(ctx, WASTE_E_STATE); }
    return wx_leave(ctx, wsnap_load(ctx, buf, len));
}

WASTE_API int32_t waste_snapshot_segment_size(waste_ctx *ctx, int32_t whole, uint64_t *size, uint64_t *base) {
    WX_ENTER(ctx);
    if (!size || !base) { wx_err(ctx, "size and base must not be NULL"); return wx_leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    wsnap_segment_size(ctx, whole, size, base);
    return wx_leave(ctx, WASTE_OK);
}

WASTE_API int32_t waste_snapshot_segment_save(waste_ctx *ctx, int32_t whole, void *buf, uint64_t cap, uint64_t *n_out) {
    WX_ENTER(ctx);
    if (!n_out || (!buf && cap)) { wx_err(ctx, "buf and n_out must not be NULL"); return wx_leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    if (ctx->poisoned) { wx_err(ctx, "%s", POISONED); return wx_leave(ctx, WASTE_E_STATE); }
    return wx_leave(ctx, wsnap_segment_save(ctx, whole, buf, cap, n_out));
}

WASTE_API int32_t waste_snapshot_chain_load(waste_ctx *ctx, const void *const *segments, const uint64_t *lens, uint32_t n) {
    WX_ENTER(ctx);
    if (!segments || !lens || n == 0) { wx_err(ctx, "segments and lens must not be NULL and n must be at least 1"); return wx_leave(ctx, WASTE_E_ARG); }
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    if (ctx->poisoned) { wx_err(ctx, "%s", POISONED); return wx_leave(ctx, WASTE_E_STATE); }
    return wx_leave(ctx, wsnap_chain_load(ctx, segments, lens, n));
}

/* ==== hotlist ====================================================================== */
WASTE_API int32_t waste_save_usage(waste_ctx *ctx, const char *path) {
    WX_ENTER(ctx);
    if (ctx->tokenizer_only) { wx_err(ctx, "the ctx was opened with tokenizer_only: it counts no expert use"); return wx_leave(ctx, WASTE_E_UNSUPPORTED); }
    if (path && !path[0]) { wx_err(ctx, "path is empty (pass NULL for the ctx's usage_path)"); return wx_leave(ctx, WASTE_E_ARG); }
    if (!path && !ctx->usage_path[0]) return wx_leave(ctx, WASTE_OK);   /* cfg.usage_path "": no usage file */
    return wx_leave(ctx, wh_save(ctx, path ? path : ctx->usage_path));
}

/* ==== not yet implemented ========================================================== */
WASTE_API int32_t waste_image_add(waste_ctx *ctx, const void *rgb, uint32_t w, uint32_t h, uint32_t *n_pos) {
    (void)rgb; (void)w; (void)h;
    WX_ENTER(ctx);
    if (n_pos) *n_pos = 0;
    wx_err(ctx, "image_add: vision is not supported by this engine yet (cfg.vision)");
    return wx_leave(ctx, WASTE_E_UNSUPPORTED);
}

WASTE_API int32_t waste_image_expand(waste_ctx *ctx, const int32_t *in, uint64_t n, int32_t *out, uint64_t cap, uint64_t *n_out) {
    (void)in; (void)n; (void)out; (void)cap;
    WX_ENTER(ctx);
    if (n_out) *n_out = 0;
    wx_err(ctx, "image_expand: vision is not supported by this engine yet (cfg.vision)");
    return wx_leave(ctx, WASTE_E_UNSUPPORTED);
}

WASTE_API int32_t waste_image_clear(waste_ctx *ctx) {
    WX_ENTER(ctx);
    wx_err(ctx, "image_clear: vision is not supported by this engine yet (cfg.vision)");
    return wx_leave(ctx, WASTE_E_UNSUPPORTED);
}
