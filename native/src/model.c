/* model.c — the kimi_linear forward pass (docs/ENGINE.md §4.1): binding tensors by canonical
 * name, memory sizing (§5), state, and evaluation of a chunk of tokens.
 *
 * A chunk runs layer-major: for each layer the mixer walks the chunk's tokens in order
 * (KDA and the conv are recurrent, MLA attends in position order), then the FFN runs per
 * token, with each routed expert loaded once per chunk. Every token sees exactly the
 * arithmetic of a single-token evaluation, so chunked prefill equals token-by-token.
 * Matrix-vector products split rows across the pool; each row is one fixed-order dot
 * product, so results do not depend on the thread count.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "sysinfo.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* ==== sizing ======================================================================= */
/* Overflow-checked u64 arithmetic (docs/ENGINE.md §3): each helper records the first overflow
 * in *ovf (the value then saturates), and the caller names the quantity that overflowed. */
static uint64_t cmul(uint64_t a, uint64_t b, int *ovf) { uint64_t r; if (!wu_mul(a, b, &r)) { *ovf = 1; return UINT64_MAX; } return r; }
static uint64_t cadd(uint64_t a, uint64_t b, int *ovf) { uint64_t r; if (!wu_add(a, b, &r)) { *ovf = 1; return UINT64_MAX; } return r; }

/* The widest activation vector (one scratch buffer): every width is a product of config
 * values below 2^24, so it is computed in u64 and the caller refuses one above 2^32. */
static uint64_t max_width(const wc_config *c) {
    uint64_t w = c->hidden;
    uint64_t cand[] = {(uint64_t)c->kda_heads * c->kda_dim, c->inter, (uint64_t)c->moe_inter * MAX(c->n_shared, 1),
                       (uint64_t)c->mla_heads * (c->d_nope + c->d_rope), (uint64_t)c->mla_heads * c->d_v,
                       (uint64_t)c->mla_heads * (c->d_nope + c->d_v), c->q_rank, (uint64_t)c->kv_rank + c->d_rope,
                       (uint64_t)c->mla_heads * c->kv_rank, c->n_experts, (uint64_t)c->kda_dim * c->kda_dim, c->rz};
    for (unsigned i = 0; i < sizeof cand / sizeof cand[0]; i++) w = MAX(w, cand[i]);
    return w;
}

/* The widest FFN vector: an input or output (hidden, or Rz under a latent MoE) or an
 * intermediate (dense, routed, or the shared experts together). */
static uint64_t ffn_width(const wc_config *c) {
    uint64_t w = MAX((uint64_t)c->hidden, (uint64_t)c->rz);
    w = MAX(w, (uint64_t)c->inter);
    return MAX(w, (uint64_t)c->moe_inter * MAX(c->n_shared, 1));
}

/* FFNs a wave holds: a decode token's routed experts plus its shared ones (at least 1). */
static uint32_t wave_cap(const wc_config *c) { return MIN(c->top_k + 1, WM_WAVE_MAX); }

/* Attention-residual blocks a forward pass holds: one per attn_res_block_size layers. */
static uint64_t res_blocks(const wc_config *c) { return c->res_block ? (c->n_layers + c->res_block - 1) / c->res_block : 0; }

/* Exact bytes of the state and scratch buffers wm_alloc_state allocates (a test checks the
 * measured allocation against the plan). State also holds the expert tables, which are
 * sized for every routed expert so the budget does not depend on the slot count. */
static uint64_t embed_row_bytes(const wc_container *c) {
    const wc_tensor *e = wc_find(c, "embed");
    return e ? wf_row_bytes(e->fmt, e->group, c->cfg.hidden) : 4ull * c->cfg.hidden;
}

static int32_t buffer_bytes(const wc_container *c, uint32_t ctx_tokens, uint32_t chunk, uint64_t *state, uint64_t *scratch,
                            char *err, uint64_t cap) {
    const wc_config *cf = &c->cfg;
    int ovf = 0;
    uint64_t hd = (uint64_t)cf->kda_heads * cf->kda_dim;   /* < 2^24 each: no overflow */
    /* per KDA layer: conv rings [3][hd][K-1] (+1 float) and S [Hk][d][d]; per MLA layer: [T][r+dr] */
    uint64_t kda = cadd(cmul(cadd(cmul(3 * hd, cf->conv_k ? cf->conv_k - 1 : 0, &ovf), 1, &ovf), 4, &ovf),
                        cmul(cmul(hd, cf->kda_dim, &ovf), 4, &ovf), &ovf);
    uint64_t mla = cmul(cmul(ctx_tokens, (uint64_t)cf->kv_rank + cf->d_rope, &ovf), 4, &ovf);
    uint64_t st = cadd((uint64_t)ctx_tokens * 4, 3ull * cf->n_layers * sizeof(float *), &ovf);
    st = cadd(st, cmul(kda, cf->n_kda, &ovf), &ovf);
    st = cadd(st, cmul(mla, cf->n_mla, &ovf), &ovf);
    st = cadd(st, cmul((uint64_t)c->n_banks * cf->n_experts, we_table_bytes(1), &ovf), &ovf);
    if (ovf) {
        wu_errf(err, cap, "memory sizing overflows u64: state (KDA %llu x %u layers + MLA %llu x %u layers at ctx_tokens %u)",
                (unsigned long long)kda, cf->n_kda, (unsigned long long)mla, cf->n_mla, ctx_tokens);
        return WASTE_E_FORMAT;
    }
    uint64_t w = max_width(cf), k = MAX(cf->top_k, 1);
    if (w > UINT32_MAX) {
        wu_errf(err, cap, "manifest.json: config widths give an activation of %llu floats (above 2^32)", (unsigned long long)w);
        return WASTE_E_FORMAT;
    }
    /* xs, xn, acc [chunk][H]; 12 buffers [maxw]; MLA scores [heads][T]; logits [V] (floats);
     * sampler pairs [2V] x 16; sel, selw [chunk][k]; expert flags [E]; one embedding row. */
    uint64_t floats = cadd(cadd(cmul(3ull * chunk, cf->hidden, &ovf), 12 * w, &ovf),
                           cadd(cmul(ctx_tokens, MAX(cf->mla_heads, 1), &ovf), cf->vocab, &ovf), &ovf);
    uint64_t sc = cadd(cmul(floats, 4, &ovf), (uint64_t)cf->vocab * 32, &ovf);
    sc = cadd(sc, cmul(2ull * chunk * 4, k, &ovf), &ovf);
    sc = cadd(sc, (uint64_t)MAX(cf->n_experts, 1) + embed_row_bytes(c) + 64, &ovf);
    /* two quantized matvec inputs (WASTE_ACT_Q8): int8 [w] and block scales [w/32 + 1] each */
    sc = cadd(sc, 2 * (w + 4 * (w / 32 + 1)), &ovf);
    /* FFN waves: per task 3 floats, 2 int8 and 2 scales per 32 of ffn_w; the MoE work list
     * [chunk][k + 1] tasks; the used experts [E] */
    uint64_t fw = ffn_width(cf);
    sc = cadd(sc, cmul(wave_cap(cf), 12 * fw + 2 * fw + 8 * (fw / 32 + 1), &ovf), &ovf);
    sc = cadd(sc, cmul(cmul(chunk, k + 1, &ovf), sizeof(wm_task), &ovf), &ovf);
    sc = cadd(sc, cmul(MAX(cf->n_experts, 1), sizeof(wm_expert), &ovf), &ovf);
    /* K3: the mix xm [H], the residual blocks [n_blocks][chunk][H], latent z and sum [chunk][Rz] x 2 */
    sc = cadd(sc, cmul(cadd(cmul(cmul(res_blocks(cf), chunk, &ovf), cf->hidden, &ovf), cf->hidden, &ovf), 4, &ovf), &ovf);
    sc = cadd(sc, cmul(cmul(2ull * chunk, cf->rz, &ovf), 4, &ovf), &ovf);
    if (ovf) { wu_errf(err, cap, "memory sizing overflows u64: scratch (%llu activation floats)", (unsigned long long)floats); return WASTE_E_FORMAT; }
    *state = st; *scratch = sc;
    return WASTE_OK;
}

int32_t wm_sizing_compute(const wc_container *c, uint32_t ctx_tokens, uint32_t chunk, uint64_t budget_cfg,
                          wm_sizing *s, char *err, uint64_t cap) {
    const wc_config *cf = &c->cfg;
    memset(s, 0, sizeof *s);
    s->trunk = c->resident_bytes;
    int32_t st = buffer_bytes(c, ctx_tokens, chunk, &s->state, &s->scratch, err, cap);
    if (st) return st;
    s->vision = 0;
    s->record = c->max_record_bytes;
    int ovf = 0;
    s->min_cache = c->n_banks ? cmul(2ull * cf->top_k, s->record, &ovf) : 0;
    s->floor = cadd(cadd(cadd(cadd(s->trunk, s->state, &ovf), s->scratch, &ovf), s->vision, &ovf), s->min_cache, &ovf);
    if (ovf) {
        wu_errf(err, cap, "memory sizing overflows u64: floor = trunk %llu + state %llu + scratch %llu + vision %llu + min cache "
                "(2 x top_k %u x record %llu)", (unsigned long long)s->trunk, (unsigned long long)s->state,
                (unsigned long long)s->scratch, (unsigned long long)s->vision, cf->top_k, (unsigned long long)s->record);
        return WASTE_E_FORMAT;
    }
    s->working_set = cmul(cmul(c->n_banks, cf->top_k, &ovf), s->record, &ovf);   /* <= every expert: checked at parse */
    s->experts = c->all_expert_bytes;
    uint64_t all_cached = cadd(s->floor - s->min_cache, s->experts, &ovf);
    if (ovf) {
        wu_errf(err, cap, "memory sizing overflows u64: floor %llu - min cache + every expert %llu", (unsigned long long)s->floor,
                (unsigned long long)s->experts);
        return WASTE_E_FORMAT;
    }
    /* floor + 3·WS may exceed u64 only when it exceeds all_cached too: saturate, min() wins. */
    int wide = 0;
    s->recommended = MIN(cadd(s->floor, cmul(3, s->working_set, &wide), &wide), all_cached);
    s->usable = wsys_usable_ram();
    uint64_t three_q = s->usable / 4 * 3;
    s->auto_budget = MAX(s->floor, MIN(three_q, s->recommended));
    if (budget_cfg == 0) {
        s->budget = s->auto_budget;
        if (s->floor > s->usable) {
            wu_errf(err, cap, "the model's floor %llu bytes is above usable RAM %llu bytes", (unsigned long long)s->floor,
                    (unsigned long long)s->usable);
            return WASTE_E_BUDGET;
        }
    } else {
        if (budget_cfg < s->floor) {
            wu_errf(err, cap, "budget %llu below the model's floor %llu (trunk %llu + state %llu + scratch %llu + vision %llu + min cache %llu)",
                    (unsigned long long)budget_cfg, (unsigned long long)s->floor, (unsigned long long)s->trunk,
                    (unsigned long long)s->state, (unsigned long long)s->scratch, (unsigned long long)s->vision,
                    (unsigned long long)s->min_cache);
            return WASTE_E_BUDGET;
        }
        if (budget_cfg > s->usable) {
            wu_errf(err, cap, "budget %llu above usable RAM %llu", (unsigned long long)budget_cfg, (unsigned long long)s->usable);
            return WASTE_E_BUDGET;
        }
        s->budget = budget_cfg;
    }
    if (s->record) {
        /* budget >= floor >= min cache, and budget <= usable RAM: no wrap. */
        uint64_t slots = (s->budget - s->floor + s->min_cache) / s->record;
        uint64_t all = (uint64_t)c->n_banks * cf->n_experts;
        s->slots = MIN(slots, all);
    }
    return WASTE_OK;
}

/* ==== binding ====================================================================== */
static int32_t bind_mat(waste_ctx *ctx, wm_mat *m, const char *name, uint64_t rows, uint64_t cols, char *err, uint64_t cap) {
    const wc_tensor *t = wc_find(&ctx->c, name);
    if (!t) { wu_errf(err, cap, "manifest.json: missing tensor %s", name); return WASTE_E_FORMAT; }
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        wu_errf(err, cap, "manifest.json: tensor %s must have shape [%llu, %llu]", name, (unsigned long long)rows, (unsigned long long)cols);
        return WASTE_E_FORMAT;
    }
    if (t->fmt != WF_F32 && t->fmt != WF_BF16 && t->fmt != WF_INT8 && t->fmt != WF_INT4) {
        wu_errf(err, cap, "tensor %s: format %s is supported for routed experts only", name, wf_name(t->fmt));
        return WASTE_E_UNSUPPORTED;
    }
    /* Defensive: the manifest check keeps every tensor but the embedding resident. */
    if (!t->data) { wu_errf(err, cap, "tensor %s: not resident (on_disk is only for embed)", name); return WASTE_E_FORMAT; }
    m->fmt = t->fmt; m->group = t->group; m->rows = (uint32_t)rows; m->cols = (uint32_t)cols;
    m->row_bytes = wf_row_bytes(t->fmt, t->group, cols);
    m->data = t->data;
    return WASTE_OK;
}

static int32_t bind_vec(waste_ctx *ctx, const float **v, const char *name, uint64_t n, uint64_t n2, char *err, uint64_t cap) {
    const wc_tensor *t = wc_find(&ctx->c, name);
    if (!t) { wu_errf(err, cap, "manifest.json: missing tensor %s", name); return WASTE_E_FORMAT; }
    int ok = n2 ? (t->ndim == 2 && t->shape[0] == n && t->shape[1] == n2) : (t->ndim == 1 && t->shape[0] == n);
    if (!ok || t->fmt != WF_F32) {
        if (n2) wu_errf(err, cap, "manifest.json: tensor %s must be f32 [%llu, %llu]", name, (unsigned long long)n, (unsigned long long)n2);
        else wu_errf(err, cap, "manifest.json: tensor %s must be f32 [%llu]", name, (unsigned long long)n);
        return WASTE_E_FORMAT;
    }
    if (!t->data) { wu_errf(err, cap, "tensor %s: not resident (on_disk is only for embed)", name); return WASTE_E_FORMAT; }
    *v = (const float *)t->data;
    return WASTE_OK;
}

#define B(x) do { int32_t st_ = (x); if (st_) return st_; } while (0)

int32_t wm_bind(waste_ctx *ctx, char *err, uint64_t cap) {
    const wc_config *c = &ctx->c.cfg;
    uint64_t H = c->hidden, V = c->vocab, hd = (uint64_t)c->kda_heads * c->kda_dim, d = c->kda_dim;
    ctx->layers = calloc(c->n_layers, sizeof(wm_layer));
    if (!ctx->layers) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    const wc_tensor *e = wc_find(&ctx->c, "embed");
    if (!e) { wu_errf(err, cap, "manifest.json: missing tensor embed"); return WASTE_E_FORMAT; }
    if (e->ndim != 2 || e->shape[0] != V || e->shape[1] != H) {
        wu_errf(err, cap, "manifest.json: tensor embed must have shape [%llu, %llu]", (unsigned long long)V, (unsigned long long)H);
        return WASTE_E_FORMAT;
    }
    if (e->fmt != WF_F32 && e->fmt != WF_BF16 && e->fmt != WF_INT8 && e->fmt != WF_INT4) {
        wu_errf(err, cap, "tensor embed: format %s is supported for routed experts only", wf_name(e->fmt)); return WASTE_E_UNSUPPORTED;
    }
    ctx->embed = e;
    B(bind_vec(ctx, &ctx->final_norm, "final_norm", H, 0, err, cap));
    B(bind_mat(ctx, &ctx->lm_head, "lm_head", V, H, err, cap));
    if (c->res_block) {
        B(bind_vec(ctx, &ctx->out_res_norm, "output_res.norm", H, 0, err, cap));
        B(bind_vec(ctx, &ctx->out_res_proj, "output_res.proj", H, 0, err, cap));
    }
    char n[128];
#define NM(fmt_) (snprintf(n, sizeof n, "blk.%u." fmt_, l), n)
    for (uint32_t l = 0; l < c->n_layers; l++) {
        wm_layer *L = &ctx->layers[l];
        L->is_mla = c->is_mla[l]; L->is_moe = c->is_moe[l]; L->bank = ctx->c.bank_of_layer[l];
        B(bind_vec(ctx, &L->attn_norm, NM("attn_norm"), H, 0, err, cap));
        B(bind_vec(ctx, &L->ffn_norm, NM("ffn_norm"), H, 0, err, cap));
        if (c->res_block) {
            B(bind_vec(ctx, &L->res_attn_norm, NM("res.attn_norm"), H, 0, err, cap));
            B(bind_vec(ctx, &L->res_attn_proj, NM("res.attn_proj"), H, 0, err, cap));
            B(bind_vec(ctx, &L->res_mlp_norm, NM("res.mlp_norm"), H, 0, err, cap));
            B(bind_vec(ctx, &L->res_mlp_proj, NM("res.mlp_proj"), H, 0, err, cap));
        }
        if (!L->is_mla) {
            B(bind_mat(ctx, &L->q_proj, NM("kda.q_proj"), hd, H, err, cap));
            B(bind_mat(ctx, &L->k_proj, NM("kda.k_proj"), hd, H, err, cap));
            B(bind_mat(ctx, &L->v_proj, NM("kda.v_proj"), hd, H, err, cap));
            B(bind_vec(ctx, &L->conv[0], NM("kda.q_conv"), hd, c->conv_k, err, cap));
            B(bind_vec(ctx, &L->conv[1], NM("kda.k_conv"), hd, c->conv_k, err, cap));
            B(bind_vec(ctx, &L->conv[2], NM("kda.v_conv"), hd, c->conv_k, err, cap));
            B(bind_vec(ctx, &L->a_log, NM("kda.a_log"), c->kda_heads, 0, err, cap));
            B(bind_vec(ctx, &L->dt_bias, NM("kda.dt_bias"), hd, 0, err, cap));
            B(bind_mat(ctx, &L->f_a, NM("kda.f_a"), d, H, err, cap));
            B(bind_mat(ctx, &L->f_b, NM("kda.f_b"), hd, d, err, cap));
            B(bind_mat(ctx, &L->b_proj, NM("kda.b_proj"), c->kda_heads, H, err, cap));
            if (c->kda_full_gate) {
                B(bind_mat(ctx, &L->kda_g, NM("kda.g_proj"), hd, H, err, cap));
            } else {
                B(bind_mat(ctx, &L->g_a, NM("kda.g_a"), d, H, err, cap));
                B(bind_mat(ctx, &L->g_b, NM("kda.g_b"), hd, d, err, cap));
            }
            B(bind_vec(ctx, &L->o_norm, NM("kda.o_norm"), d, 0, err, cap));
            B(bind_mat(ctx, &L->o_proj, NM("kda.o_proj"), H, hd, err, cap));
        } else {
            uint64_t qh = (uint64_t)c->mla_heads * (c->d_nope + c->d_rope);
            if (c->q_rank) {
                B(bind_mat(ctx, &L->mq_a, NM("mla.q_a"), c->q_rank, H, err, cap));
                B(bind_vec(ctx, &L->q_a_norm, NM("mla.q_a_norm"), c->q_rank, 0, err, cap));
                B(bind_mat(ctx, &L->mq_b, NM("mla.q_b"), qh, c->q_rank, err, cap));
            } else {
                B(bind_mat(ctx, &L->mq, NM("mla.q_proj"), qh, H, err, cap));
            }
            B(bind_mat(ctx, &L->kv_a, NM("mla.kv_a"), c->kv_rank + c->d_rope, H, err, cap));
            B(bind_vec(ctx, &L->kv_a_norm, NM("mla.kv_a_norm"), c->kv_rank, 0, err, cap));
            B(bind_mat(ctx, &L->kv_b, NM("mla.kv_b"), (uint64_t)c->mla_heads * (c->d_nope + c->d_v), c->kv_rank, err, cap));
            B(bind_mat(ctx, &L->mo, NM("mla.o_proj"), H, (uint64_t)c->mla_heads * c->d_v, err, cap));
            if (c->mla_gate) B(bind_mat(ctx, &L->mla_g, NM("mla.g_proj"), (uint64_t)c->mla_heads * c->d_v, H, err, cap));
        }
        if (!L->is_moe) {
            B(bind_mat(ctx, &L->gate, NM("ffn.gate"), c->inter, H, err, cap));
            B(bind_mat(ctx, &L->up, NM("ffn.up"), c->inter, H, err, cap));
            B(bind_mat(ctx, &L->down, NM("ffn.down"), H, c->inter, err, cap));
            L->has_ffn = 1;
        } else {
            const float *rw;
            B(bind_vec(ctx, &rw, NM("moe.router"), c->n_experts, H, err, cap));
            L->router = (wm_mat){WF_F32, 0, c->n_experts, (uint32_t)H, H * 4, (const uint8_t *)rw};
            B(bind_vec(ctx, &L->router_bias, NM("moe.router_bias"), c->n_experts, 0, err, cap));
            if (c->rz) {
                B(bind_mat(ctx, &L->lat_down, NM("moe.latent_down"), c->rz, H, err, cap));
                B(bind_mat(ctx, &L->lat_up, NM("moe.latent_up"), H, c->rz, err, cap));
                if (c->latent_norm) B(bind_vec(ctx, &L->lat_norm, NM("moe.latent_norm"), c->rz, 0, err, cap));
            }
            if (c->n_shared) {
                uint64_t w = (uint64_t)c->moe_inter * c->n_shared;
                B(bind_mat(ctx, &L->gate, NM("moe.shared_gate"), w, H, err, cap));
                B(bind_mat(ctx, &L->up, NM("moe.shared_up"), w, H, err, cap));
                B(bind_mat(ctx, &L->down, NM("moe.shared_down"), H, w, err, cap));
                L->has_ffn = 1;
            }
        }
    }
#undef NM
    return WASTE_OK;
}

/* Parameters are trained weights: the router's selection bias is a buffer, not counted. */
static int is_param(const wc_tensor *t) { return !strstr(t->name, ".moe.router_bias"); }

uint64_t wm_params_total(const waste_ctx *ctx) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < ctx->c.n_tensors; i++) {
        const wc_tensor *t = &ctx->c.tensors[i];
        if (!is_param(t)) continue;
        n += t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
    }
    const wc_config *c = &ctx->c.cfg;
    n += (uint64_t)c->n_moe * c->n_experts * 3ull * (c->rz ? c->rz : c->hidden) * c->moe_inter;
    return n;
}

uint64_t wm_params_active(const waste_ctx *ctx) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < ctx->c.n_tensors; i++) {
        const wc_tensor *t = &ctx->c.tensors[i];
        if (!strcmp(t->name, "embed") || !is_param(t)) continue;
        n += t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
    }
    const wc_config *c = &ctx->c.cfg;
    n += (uint64_t)c->n_moe * c->top_k * 3ull * (c->rz ? c->rz : c->hidden) * c->moe_inter;
    return n;
}

/* ==== state ======================================================================== */
/* calloc that adds what it asked for to *sum, so the charge is measured, not assumed. */
static void *counted(uint64_t n, uint64_t size, uint64_t *sum) {
    void *p = calloc(n, size);
    if (p) *sum += n * size;
    return p;
}

int32_t wm_alloc_state(waste_ctx *ctx, uint64_t *bytes, char *err, uint64_t cap) {
    const wc_config *c = &ctx->c.cfg;
    uint32_t L = c->n_layers, T = ctx->ctx_tokens, chunk = ctx->prefill_chunk;
    uint64_t hd = (uint64_t)c->kda_heads * c->kda_dim;
    uint64_t sum = 0;
    ctx->ids = counted(T, sizeof(int32_t), &sum);
    ctx->conv = counted(L, sizeof(float *), &sum);
    ctx->S = counted(L, sizeof(float *), &sum);
    ctx->lat = counted(L, sizeof(float *), &sum);
    if (!ctx->ids || !ctx->conv || !ctx->S || !ctx->lat) goto oom;
    for (uint32_t l = 0; l < L; l++) {
        if (!c->is_mla[l]) {
            ctx->conv[l] = counted(3 * hd * (c->conv_k - 1) + 1, sizeof(float), &sum);
            ctx->S[l] = counted((uint64_t)c->kda_heads * c->kda_dim * c->kda_dim, sizeof(float), &sum);
            if (!ctx->conv[l] || !ctx->S[l]) goto oom;
        } else {
            ctx->lat[l] = counted((uint64_t)T * (c->kv_rank + c->d_rope), sizeof(float), &sum);
            if (!ctx->lat[l]) goto oom;
        }
    }
    ctx->maxw = (uint32_t)max_width(c);   /* buffer_bytes refused a width above 2^32 */
    ctx->xs = counted((uint64_t)chunk * c->hidden, sizeof(float), &sum);
    ctx->xn = counted((uint64_t)chunk * c->hidden, sizeof(float), &sum);
    ctx->acc = counted((uint64_t)chunk * c->hidden, sizeof(float), &sum);
    ctx->scores = counted((uint64_t)T * MAX(c->mla_heads, 1), sizeof(float), &sum);
    ctx->logits = counted(c->vocab, sizeof(float), &sum);
    ctx->sample_pairs = counted(2 * (uint64_t)c->vocab, 16, &sum);  /* struct ws_pair is {double, int32_t, pad} */
    ctx->sel = counted((uint64_t)chunk * MAX(c->top_k, 1), sizeof(int32_t), &sum);
    ctx->selw = counted((uint64_t)chunk * MAX(c->top_k, 1), sizeof(float), &sum);
    ctx->expert_used = counted(MAX(c->n_experts, 1), 1, &sum);
    ctx->row_tmp = counted(wf_row_bytes(ctx->embed->fmt, ctx->embed->group, c->hidden) + 64, 1, &sum);
    if (!ctx->xs || !ctx->xn || !ctx->acc || !ctx->scores || !ctx->logits || !ctx->sample_pairs ||
        !ctx->sel || !ctx->selw || !ctx->expert_used || !ctx->row_tmp) goto oom;
    for (int i = 0; i < 12; i++) if (!(ctx->buf[i] = counted(ctx->maxw, sizeof(float), &sum))) goto oom;
    ctx->xq = counted(2 * (uint64_t)ctx->maxw, 1, &sum);
    ctx->xd = counted(2 * ((uint64_t)ctx->maxw / 32 + 1), sizeof(float), &sum);
    if (!ctx->xq || !ctx->xd) goto oom;
    ctx->wave_cap = wave_cap(c);
    ctx->ffn_w = (uint32_t)ffn_width(c);   /* ≤ max_width */
    ctx->wave_f = counted((uint64_t)ctx->wave_cap * 3 * ctx->ffn_w, sizeof(float), &sum);
    ctx->wave_q = counted((uint64_t)ctx->wave_cap * 2 * ctx->ffn_w, 1, &sum);
    ctx->wave_d = counted((uint64_t)ctx->wave_cap * 2 * (ctx->ffn_w / 32 + 1), sizeof(float), &sum);
    ctx->tasks = counted((uint64_t)chunk * (MAX(c->top_k, 1) + 1), sizeof(wm_task), &sum);
    ctx->exs = counted(MAX(c->n_experts, 1), sizeof(wm_expert), &sum);
    if (!ctx->wave_f || !ctx->wave_q || !ctx->wave_d || !ctx->tasks || !ctx->exs) goto oom;
    ctx->xm = counted(c->hidden, sizeof(float), &sum);
    ctx->res = res_blocks(c) ? counted(res_blocks(c) * chunk * c->hidden, sizeof(float), &sum) : NULL;
    ctx->lz = c->rz ? counted((uint64_t)chunk * c->rz, sizeof(float), &sum) : NULL;
    ctx->lacc = c->rz ? counted((uint64_t)chunk * c->rz, sizeof(float), &sum) : NULL;
    if (!ctx->xm || (res_blocks(c) && !ctx->res) || (c->rz && (!ctx->lz || !ctx->lacc))) goto oom;
    *bytes = sum;
    return WASTE_OK;
oom:
    *bytes = sum;
    wu_errf(err, cap, "out of memory allocating state and scratch");
    return WASTE_E_NOMEM;
}

void wm_free_state(waste_ctx *ctx) {
    uint32_t L = ctx->c.cfg.n_layers;
    for (uint32_t l = 0; l < L; l++) {
        if (ctx->conv) free(ctx->conv[l]);
        if (ctx->S) free(ctx->S[l]);
        if (ctx->lat) free(ctx->lat[l]);
    }
    free(ctx->conv); free(ctx->S); free(ctx->lat); free(ctx->ids);
    free(ctx->xs); free(ctx->xn); free(ctx->acc); free(ctx->scores); free(ctx->logits);
    free(ctx->sample_pairs); free(ctx->sel); free(ctx->selw); free(ctx->expert_used); free(ctx->row_tmp);
    for (int i = 0; i < 12; i++) free(ctx->buf[i]);
    free(ctx->xq); free(ctx->xd);
    free(ctx->wave_f); free(ctx->wave_q); free(ctx->wave_d); free(ctx->tasks); free(ctx->exs);
    free(ctx->xm); free(ctx->res); free(ctx->lz); free(ctx->lacc);
}

void wm_reset_state(waste_ctx *ctx) {
    const wc_config *c = &ctx->c.cfg;
    uint64_t hd = (uint64_t)c->kda_heads * c->kda_dim;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (!c->is_mla[l]) {
            memset(ctx->conv[l], 0, (3 * hd * (c->conv_k - 1)) * sizeof(float));
            memset(ctx->S[l], 0, (uint64_t)c->kda_heads * c->kda_dim * c->kda_dim * sizeof(float));
        }
    }
    ctx->pos = 0;
    ctx->has_logits = 0;
    ctx->seg_anchored = 0;
}

/* ==== math helpers (f32) =========================================================== */
/* Transcendentals are the engine's own (numerics.c); sqrtf is IEEE-exact and stays libm's. */
static float sigmoidf_(float x) { return 1.0f / (1.0f + wn_expf(-x)); }

/* σ(x), or SiLU x·σ(x) with times_x, over arrays, through the kernel set's exp (wn_expf's
 * bits, lanes at a time): each σ has sigmoidf_'s bits, and SiLU's is x times it, rounded. y
 * may alias x. */
#define ACT_CHUNK 64
static void sigmoid_n(const wk_kernels *K, float *y, const float *x, uint32_t n, int times_x) {
    float e[ACT_CHUNK];
    for (uint32_t i0 = 0; i0 < n; i0 += ACT_CHUNK) {
        uint32_t m = MIN(ACT_CHUNK, n - i0);
        for (uint32_t i = 0; i < m; i++) e[i] = -x[i0 + i];
        K->exp_f32(e, e, m);
        for (uint32_t i = 0; i < m; i++) {
            float sg = 1.0f / (1.0f + e[i]);
            y[i0 + i] = times_x ? x[i0 + i] * sg : sg;
        }
    }
}

/* y = w ⊙ x / sqrt(mean(x²) + eps); x and y may alias. */
static void rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (uint32_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* Below this many weights a matvec stays on the calling thread: a fork-join costs a few
 * microseconds, about what 64 Ki int8 weights take on one core (a router, a small LoRA). */
#define FORK_MIN_WORK 65536

/* One matrix of a fork-join: y[rows of m] = m·x, x quantized as xq/xd (WASTE_ACT_Q8) or NULL. */
typedef struct { const wm_mat *m; const float *x; const int8_t *xq; const float *xd; float *y; } mv_item;

/* Every row of every item in one fork-join, rows numbered through the items in order, each
 * row computed by one worker: the same bits at any thread count. */
#define MV_ITEMS 8
typedef struct { const wk_kernels *k; const mv_item *it; uint32_t start[MV_ITEMS + 1]; uint32_t n; } mv_job;

static void mv_rows(void *arg, uint32_t b, uint32_t e) {
    const mv_job *j = arg;
    for (uint32_t i = 0; i < j->n; i++) {
        uint32_t lo = MAX(b, j->start[i]), hi = MIN(e, j->start[i + 1]);
        const mv_item *t = &j->it[i];
        if (lo < hi) wk_matvec_rows(j->k, t->m, lo - j->start[i], hi - j->start[i], t->x, t->xq, t->xd, t->y);
    }
}

/* fn over items [0, n): on the pool when `work` weights are worth a fork-join, else here. */
static void fork_join(waste_ctx *ctx, uint32_t n, uint64_t work, wp_fn fn, void *arg) {
    if (work >= FORK_MIN_WORK && wp_size(ctx->pool) > 1) wp_run(ctx->pool, n, fn, arg);
    else fn(arg, 0, n);
}

static void matvec_items(waste_ctx *ctx, uint32_t n, const mv_item *it) {
    mv_job j = {.k = ctx->k, .it = it, .n = n};
    uint64_t work = 0;
    for (uint32_t i = 0; i < n; i++) {
        j.start[i + 1] = j.start[i] + it[i].m->rows;
        work += (uint64_t)it[i].m->rows * it[i].m->cols;
    }
    fork_join(ctx, j.start[n], work, mv_rows, &j);
}

/* Whether m meets its input quantized (WASTE_ACT_Q8 and an int8/int4/mxfp4 matrix). */
static int meets_q8(const waste_ctx *ctx, const wm_mat *m) { return ctx->act_q8 && wk_q8_format(m->fmt); }

/* Quantized input buffer qi (0 or 1: two inputs can be held at once) holding x when any of
 * ms[0..n) meets it quantized (cols ≤ maxw: every input is an activation buffer); NULLs else. */
static void quantized_input(waste_ctx *ctx, uint32_t n, const wm_mat *const *ms, const float *x, uint32_t qi,
                            const int8_t **xq, const float **xd) {
    int q8 = 0;
    for (uint32_t i = 0; i < n; i++) q8 |= meets_q8(ctx, ms[i]);
    *xq = NULL; *xd = NULL;
    if (!q8) return;
    int8_t *q = ctx->xq + (uint64_t)qi * ctx->maxw;
    float *d = ctx->xd + (uint64_t)qi * (ctx->maxw / 32 + 1);
    ctx->k->quantize_q8(x, ms[0]->cols, q, d);
    *xq = q; *xd = d;
}

/* The item y = m·x, x quantized into input buffer qi when m meets it quantized. */
static mv_item mv_item_of(waste_ctx *ctx, const wm_mat *m, const float *x, float *y, uint32_t qi) {
    mv_item it = {m, x, NULL, NULL, y};
    quantized_input(ctx, 1, &m, x, qi, &it.xq, &it.xd);
    return it;
}

/* ys[i] = ms[i]·x for n ≤ MV_ITEMS matrices of one input width in one fork-join (the input
 * quantized once); no y aliases x. */
static void matvec_many(waste_ctx *ctx, uint32_t n, const wm_mat *const *ms, const float *x, float *const *ys) {
    mv_item it[MV_ITEMS];
    const int8_t *xq; const float *xd;
    quantized_input(ctx, n, ms, x, 0, &xq, &xd);
    for (uint32_t i = 0; i < n; i++)
        it[i] = (mv_item){ms[i], x, meets_q8(ctx, ms[i]) ? xq : NULL, meets_q8(ctx, ms[i]) ? xd : NULL, ys[i]};
    matvec_items(ctx, n, it);
}

/* y[rows] = M·x; y must not alias x. */
static void matvec(waste_ctx *ctx, const wm_mat *m, const float *x, float *y) {
    matvec_many(ctx, 1, &m, x, &y);
}

/* ==== KDA ========================================================================== */
/* Heads [h0, h1) of one token: each head's inputs from its projections, then its delta
 * rule, decay first. S: [d keys][d values]. Each head owns its channels of the projections
 * and the conv state, its state, its output and its scratch (ea, r, delta: [Hk][d]), so
 * heads split over the pool give the same bits at any thread count. Row i of S is decayed
 * and read (r), then updated and read (o), in one pass each: every r[j] and o[j] still sums
 * its rows in ascending i, and every S element sees the same operations as in four separate
 * passes. */
typedef struct {
    waste_ctx *ctx; const wm_layer *L; uint32_t l;
    float *q, *k, *v, *g, *beta;   /* the projections, made the heads' inputs in place */
    const float *z;
    float *ea, *r, *delta, *y;     /* ea: [Hk][d] scratch of the decay gate */
} kda_job;

/* Head h's inputs from its projections, in place (docs/ENGINE.md §4.2.6): the short conv over
 * the last K-1 pre-conv inputs plus the current one, then SiLU, on the head's channels of q, k
 * and v; q and k L2-normalised, q scaled by 1/sqrt(d); the head's decay gate g; its beta
 * through σ. Every element sees the same operations whichever worker takes the head. */
static void kda_head_inputs(const kda_job *j, uint32_t h) {
    waste_ctx *ctx = j->ctx;
    const wc_config *c = &ctx->c.cfg;
    const wm_layer *L = j->L;
    uint32_t d = c->kda_dim, hd = c->kda_heads * d, K = c->conv_k, i0 = h * d, i1 = i0 + d;
    float *p[3] = {j->q, j->k, j->v};
    // conv state st: [3][hd][K-1] (oldest tap first), taps w: [hd][K]; the head's channels [i0, i1)
    for (int ch = 0; ch < 3; ch++) {
        float *st = ctx->conv[j->l] + (uint64_t)ch * hd * (K - 1);
        const float *w = L->conv[ch];
        for (uint32_t i = i0; i < i1; i++) {
            float *sv = st + (uint64_t)i * (K - 1);
            float u = 0.0f;
            for (uint32_t t = 0; t + 1 < K; t++) u += w[(uint64_t)i * K + t] * sv[t];
            u += w[(uint64_t)i * K + K - 1] * p[ch][i];
            for (uint32_t t = 0; t + 2 < K; t++) sv[t] = sv[t + 1];
            if (K > 1) sv[K - 2] = p[ch][i];
            p[ch][i] = u;
        }
        sigmoid_n(ctx->k, p[ch] + i0, p[ch] + i0, d, 1);
    }
    float *q = j->q, *k = j->k, *g = j->g;
    float qscale = 1.0f / sqrtf((float)d), sq = 0.0f, sk = 0.0f;
    for (uint32_t i = i0; i < i1; i++) { sq += q[i] * q[i]; sk += k[i] * k[i]; }
    float nq = sqrtf(sq + c->l2_eps), nk = sqrtf(sk + c->l2_eps);
    for (uint32_t i = i0; i < i1; i++) { q[i] = q[i] / nq * qscale; k[i] = k[i] / nk; }
    /* Per-channel decay gate, a = f_b(f_a x) + dt_bias: g = -exp(A_log[h]) * softplus(a), or
     * with the lower bound λ (§4.2.6) g = λ * σ(exp(A_log[h]) * a), no softplus. */
    float A = wn_expf(L->a_log[h]);
    if (c->lower_bound) {
        for (uint32_t i = i0; i < i1; i++) g[i] = c->gate_lb * sigmoidf_(A * (g[i] + L->dt_bias[i]));
    } else {
        /* softplus(a) = log(1 + e^a) in f32, as the reference computes it; a > 20 passes
         * through (§4.1). */
        float *ea = j->ea;
        for (uint32_t i = i0; i < i1; i++) g[i] = g[i] + L->dt_bias[i];
        ctx->k->exp_f32(g + i0, ea + i0, d);
        for (uint32_t i = i0; i < i1; i++) g[i] = -A * (g[i] > 20.0f ? g[i] : wn_logf(1.0f + ea[i]));
    }
    j->beta[h] = sigmoidf_(j->beta[h]);
}

static void kda_heads(void *arg, uint32_t h0, uint32_t h1) {
    const kda_job *j = arg;
    waste_ctx *ctx = j->ctx;
    const wc_config *c = &ctx->c.cfg;
    const wk_kernels *K = ctx->k;
    uint32_t d = c->kda_dim;
    // S: [Hk][d][d]; r, delta, y: [Hk][d]
    for (uint32_t h = h0; h < h1; h++) {
        kda_head_inputs(j, h);
        float *S = ctx->S[j->l] + (uint64_t)h * d * d;
        const float *kh = j->k + h * d, *qh = j->q + h * d, *vh = j->v + h * d, *gh = j->g + h * d;
        float *r = j->r + h * d, *delta = j->delta + h * d, *o = j->y + h * d;
        for (uint32_t jj = 0; jj < d; jj++) r[jj] = 0.0f;
        K->exp_f32(gh, delta, d);   /* each key row's decay e^g (delta is free until below) */
        for (uint32_t i = 0; i < d; i++) K->decay_read(S + (uint64_t)i * d, delta[i], kh[i], r, d);
        for (uint32_t jj = 0; jj < d; jj++) delta[jj] = (vh[jj] - r[jj]) * j->beta[h];
        for (uint32_t jj = 0; jj < d; jj++) o[jj] = 0.0f;
        for (uint32_t i = 0; i < d; i++) K->update_read(S + (uint64_t)i * d, kh[i], delta, qh[i], o, d);
        rmsnorm(o, o, j->L->o_norm, d, c->rms_eps);
        sigmoid_n(K, r, j->z + h * d, d, 0);   /* r is free again */
        for (uint32_t jj = 0; jj < d; jj++) o[jj] *= r[jj];
    }
}

static void kda_step(waste_ctx *ctx, uint32_t l, const float *xn, float *out) {
    const wc_config *c = &ctx->c.cfg;
    const wm_layer *L = &ctx->layers[l];
    uint32_t Hk = c->kda_heads;
    float *p[3] = {ctx->buf[0], ctx->buf[1], ctx->buf[2]};   /* q, k, v: [Hk·d] */
    float *fa = ctx->buf[3], *g = ctx->buf[4], *beta = ctx->buf[5], *z = ctx->buf[6], *y = ctx->buf[7];
    float *r = ctx->buf[8], *delta = ctx->buf[9];
    /* Every projection of xn in one fork-join: q, k, v, f_a, b_proj and the gate's first
     * matrix (the full-rank gate, or g_a of the low-rank one into ga). */
    // xn: [H] -> p[q|k|v]: [hd] (hd = Hk * d), fa: [d], beta: [Hk], z: [hd] (full gate) or ga: [d]
    float *ga = r;   /* r is free until the delta rule; g_b reads ga before it */
    {
        const wm_mat *ms[] = {&L->q_proj, &L->k_proj, &L->v_proj, &L->f_a, &L->b_proj,
                              c->kda_full_gate ? &L->kda_g : &L->g_a};
        float *ys[] = {p[0], p[1], p[2], fa, beta, c->kda_full_gate ? z : ga};
        matvec_many(ctx, 6, ms, xn, ys);
    }
    // fa: [d] -> g: [hd], and (low-rank gate) ga: [d] -> z: [hd], in one fork-join; a_log: [Hk], dt_bias: [hd]
    {
        mv_item it[2] = {mv_item_of(ctx, &L->f_b, fa, g, 0)};
        if (!c->kda_full_gate) it[1] = mv_item_of(ctx, &L->g_b, ga, z, 1);
        matvec_items(ctx, c->kda_full_gate ? 1 : 2, it);
    }
    /* Per head (kda_heads), the heads split over the pool: its inputs (conv, SiLU, norms, gate,
     * beta; kda_head_inputs), then the delta rule. */
    // r, delta, ea: [Hk][d] (buf 8, 9, 10 hold max_width ≥ Hk·d); y: [Hk][d] -> out: [H]
    kda_job job = {ctx, L, l, p[0], p[1], p[2], g, beta, z, ctx->buf[10], r, delta, y};
    if (Hk > 1 && wp_size(ctx->pool) > 1) wp_run(ctx->pool, Hk, kda_heads, &job);
    else kda_heads(&job, 0, Hk);
    matvec(ctx, &L->o_proj, y, out);
}

/* ==== MLA (NoPE, latent cache, kv_b absorbed) ====================================== */
/* Heads [h0, h1) of one token, split over the pool: the absorbed query qabs[h] = W_knᵀ q_n
 * (kv_b's nope rows of the head folded into the query), the scores against every cached
 * latent in position order, their softmax, the context ctxc[h] = Σ_t p_t c_kv[t], and the
 * head's output o[h] = W_v ctxc[h]. Each head owns its rows of qabs, ctxc, the decode
 * scratch, its scores and o, and its sums run in the same order on any worker: the same bits
 * at any thread count. */
typedef struct {
    waste_ctx *ctx; const wm_layer *L; const float *q, *lat; float *qabs, *ctxc, *row, *o;
    uint64_t pos; float scale;
} mla_job;

static void mla_heads(void *arg, uint32_t h0, uint32_t h1) {
    const mla_job *j = arg;
    waste_ctx *ctx = j->ctx;
    const wc_config *c = &ctx->c.cfg;
    uint32_t dn = c->d_nope, dr = c->d_rope, dv = c->d_v, r = c->kv_rank, lw = r + dr;
    for (uint32_t h = h0; h < h1; h++) {
        const float *qn = j->q + (uint64_t)h * (dn + dr), *qr = qn + dn;
        float *qabs = j->qabs + (uint64_t)h * r, *row = j->row + (uint64_t)h * r, *ctxc = j->ctxc + (uint64_t)h * r;
        float *sc = ctx->scores + (uint64_t)h * ctx->ctx_tokens;
        /* q_n · (W_kn c) = (W_knᵀ q_n) · c: fold the nope rows of kv_b into the query. */
        // kv_b: [nh][dn + dv][r]; qabs, row, ctxc: [nh][r]; scores: [nh][ctx_tokens]
        for (uint32_t i = 0; i < r; i++) qabs[i] = 0.0f;
        for (uint32_t i = 0; i < dn; i++) wk_axpy_row(ctx->k, &j->L->kv_b, h * (dn + dv) + i, qn[i], qabs, row);
        // scores: [pos + 1], in position order
        float mx = -INFINITY;
        for (uint64_t t = 0; t <= j->pos; t++) {
            const float *lt = j->lat + t * lw;
            float s = ctx->k->dot_f32(qabs, lt, r) + (dr ? ctx->k->dot_f32(qr, lt + r, dr) : 0.0f);
            s *= j->scale;
            sc[t] = s;
            if (s > mx) mx = s;
        }
        float sum = 0.0f;
        for (uint64_t t = 0; t <= j->pos; t++) sc[t] = sc[t] - mx;
        ctx->k->exp_f32(sc, sc, (uint32_t)(j->pos + 1));
        for (uint64_t t = 0; t <= j->pos; t++) sum += sc[t];
        // ctxc[h]: [r] = sum_t p_t c_kv[t], each element summed in position order
        for (uint32_t i = 0; i < r; i++) ctxc[i] = 0.0f;
        for (uint64_t t = 0; t <= j->pos; t++) ctx->k->axpy_f32(ctxc, sc[t] / sum, j->lat + t * lw, r);
        // ctxc: [r] -> o[h]: [dv]
        for (uint32_t i = 0; i < dv; i++) j->o[h * dv + i] = wk_dot_row(ctx->k, &j->L->kv_b, h * (dn + dv) + dn + i, ctxc);
    }
}

static void mla_step(waste_ctx *ctx, uint32_t l, const float *xn, uint64_t pos, float *out) {
    const wc_config *c = &ctx->c.cfg;
    const wm_layer *L = &ctx->layers[l];
    uint32_t nh = c->mla_heads, dn = c->d_nope, dr = c->d_rope, dv = c->d_v, r = c->kv_rank, lw = r + dr;
    float *q = ctx->buf[0], *qa = ctx->buf[1], *ckv = ctx->buf[2], *qabs = ctx->buf[3], *ctxc = ctx->buf[4];
    float *o = ctx->buf[5], *row = ctx->buf[6];
    /* The projections of xn in one fork-join: q (or q-LoRA's down side) and kv_a. */
    // xn: [H] -> q: [nh][dn + dr] (via qa: [q_rank] with q-LoRA); ckv: [r + dr]
    {
        const wm_mat *ms[] = {c->q_rank ? &L->mq_a : &L->mq, &L->kv_a};
        float *ys[] = {c->q_rank ? qa : q, ckv};
        matvec_many(ctx, 2, ms, xn, ys);
    }
    if (c->q_rank) {
        rmsnorm(qa, qa, L->q_a_norm, c->q_rank, c->mla_eps);
        matvec(ctx, &L->mq_b, qa, q);
    }
    // latent cache lat: [ctx_tokens][r + dr] = (c_kv normed, k_r) per position
    float *lat = ctx->lat[l];
    float *cur = lat + pos * lw;
    rmsnorm(cur, ckv, L->kv_a_norm, r, c->mla_eps);
    memcpy(cur + r, ckv + r, dr * sizeof(float));
    // qabs, ctxc, row: [nh][r] (buf 3, 4, 6 hold max_width ≥ nh·r)
    mla_job job = {ctx, L, q, lat, qabs, ctxc, row, o, pos, 1.0f / sqrtf((float)(dn + dr))};
    if (nh > 1 && wp_size(ctx->pool) > 1) wp_run(ctx->pool, nh, mla_heads, &job);
    else mla_heads(&job, 0, nh);
    /* Sigmoid output gate on the concatenated heads (docs/ENGINE.md §4.2.4); row is free again. */
    // xn: [H] -> row: [nh * dv]; o: [nh][dv] -> out: [H]
    if (c->mla_gate) {
        matvec(ctx, &L->mla_g, xn, row);
        for (uint32_t i = 0; i < nh * dv; i++) o[i] *= sigmoidf_(row[i]);
    }
    matvec(ctx, &L->mo, o, out);
}

/* ==== FFN ========================================================================== */
/* y = down(act(gate x, up x)): silu(g)·u, or SiTU (docs/ENGINE.md §4.2.1)
 * β·tanh(g/β)·σ(g) · β_l·tanh(u/β_l), with u unchanged when β_l is unset. */
static void ffn_act(const waste_ctx *ctx, float *g, const float *u, uint32_t i0, uint32_t i1) {
    const wc_config *c = &ctx->c.cfg;
    if (!c->situ) {
        sigmoid_n(ctx->k, g + i0, g + i0, i1 - i0, 1);
        for (uint32_t i = i0; i < i1; i++) g[i] = g[i] * u[i];
    } else {
        float b = c->situ_beta, bl = c->situ_lbeta;
        for (uint32_t i = i0; i < i1; i++) {
            float left = b * wn_tanhf(g[i] / b) * sigmoidf_(g[i]);
            g[i] = left * (c->has_lbeta ? bl * wn_tanhf(u[i] / bl) : u[i]);
        }
    }
}

/* A wave: up to wave_cap FFNs (routed experts on their tokens, shared experts, a dense FFN)
 * in two fork-joins instead of two each. The first computes every gate and up row, numbered
 * through the tasks, and the activation of the rows it computed; the second every down row.
 * Each row has one owner and each task its own buffers, so the bits are those of one FFN
 * at a time, at any thread count. */
typedef struct {
    const wm_mat *gate, *up, *down;
    const float *x; const int8_t *xq; const float *xd;   /* input [gate->cols], quantized or NULL */
    uint32_t buf;                                       /* its wave buffer (< wave_cap) */
    float *g, *u, *y;                                   /* [I], [I], [down->rows]: the buffer's */
    int8_t *gq; float *gd;                              /* act(g, u) quantized for down */
} ffn_task;

typedef struct { const waste_ctx *ctx; const ffn_task *t; uint32_t n; uint32_t start[WM_WAVE_MAX + 1]; } ffn_job;

static void ffn_gate_up_rows(void *arg, uint32_t b, uint32_t e) {
    const ffn_job *j = arg;
    for (uint32_t i = 0; i < j->n; i++) {
        uint32_t lo = MAX(b, j->start[i]), hi = MIN(e, j->start[i + 1]);
        if (lo >= hi) continue;
        const ffn_task *t = &j->t[i];
        uint32_t r0 = lo - j->start[i], r1 = hi - j->start[i];
        wk_matvec_rows(j->ctx->k, t->gate, r0, r1, t->x, t->xq, t->xd, t->g);
        wk_matvec_rows(j->ctx->k, t->up, r0, r1, t->x, t->xq, t->xd, t->u);
        ffn_act(j->ctx, t->g, t->u, r0, r1);
    }
}

static void ffn_down_rows(void *arg, uint32_t b, uint32_t e) {
    const ffn_job *j = arg;
    for (uint32_t i = 0; i < j->n; i++) {
        uint32_t lo = MAX(b, j->start[i]), hi = MIN(e, j->start[i + 1]);
        const ffn_task *t = &j->t[i];
        if (lo < hi) wk_matvec_rows(j->ctx->k, t->down, lo - j->start[i], hi - j->start[i], t->g, t->gq, t->gd, t->y);
    }
}

/* A wave buffer's FFN output y: [ffn_w]. */
static float *ffn_out(const waste_ctx *ctx, uint32_t buf) { return ctx->wave_f + ((uint64_t)buf * 3 + 2) * ctx->ffn_w; }

/* Runs tasks [0, n) (n ≤ wave_cap), each in its own wave buffer (t[i].buf, distinct); the
 * output is left in the buffer's y (ffn_out). The inputs are quantized here, once per
 * distinct input pointer in a row of tasks. */
static void ffn_wave(waste_ctx *ctx, ffn_task *t, uint32_t n) {
    ffn_job j = {.ctx = ctx, .t = t, .n = n};
    uint64_t work = 0;
    uint32_t fw = ctx->ffn_w;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t bi = t[i].buf;
        t[i].g = ctx->wave_f + (uint64_t)bi * 3 * fw;
        t[i].u = t[i].g + fw;
        t[i].y = t[i].u + fw;
        t[i].gq = ctx->wave_q + (uint64_t)bi * 2 * fw;
        t[i].gd = ctx->wave_d + (uint64_t)bi * 2 * (fw / 32 + 1);
        int q8 = meets_q8(ctx, t[i].gate) || meets_q8(ctx, t[i].up);
        if (q8 && i > 0 && t[i - 1].x == t[i].x && t[i - 1].xq) { t[i].xq = t[i - 1].xq; t[i].xd = t[i - 1].xd; }
        else if (q8) {
            int8_t *xq = t[i].gq + fw; float *xd = t[i].gd + fw / 32 + 1;
            ctx->k->quantize_q8(t[i].x, t[i].gate->cols, xq, xd);
            t[i].xq = xq; t[i].xd = xd;
        } else { t[i].xq = NULL; t[i].xd = NULL; }
        j.start[i + 1] = j.start[i] + t[i].gate->rows;
        work += 2ull * t[i].gate->rows * t[i].gate->cols;
    }
    fork_join(ctx, j.start[n], work, ffn_gate_up_rows, &j);
    work = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (meets_q8(ctx, t[i].down)) ctx->k->quantize_q8(t[i].g, t[i].down->cols, t[i].gq, t[i].gd);
        else { t[i].gq = NULL; t[i].gd = NULL; }
        j.start[i + 1] = j.start[i] + t[i].down->rows;
        work += (uint64_t)t[i].down->rows * t[i].down->cols;
    }
    fork_join(ctx, j.start[n], work, ffn_down_rows, &j);
}

/* One FFN: y = down(act(gate x, up x)), through wave buffer 0; y must not alias x. */
static void swiglu(waste_ctx *ctx, const wm_mat *gate, const wm_mat *up, const wm_mat *down, const float *x, float *y) {
    ffn_task t = {.gate = gate, .up = up, .down = down, .x = x, .buf = 0};
    ffn_wave(ctx, &t, 1);
    memcpy(y, t.y, (uint64_t)down->rows * sizeof(float));
}

static void route(waste_ctx *ctx, const wm_layer *L, const float *xn, int32_t *sel, float *w) {
    const wc_config *c = &ctx->c.cfg;
    float *s = ctx->buf[11];
    // xn: [H] -> s: [E]; sel, w: [top_k]
    matvec(ctx, &L->router, xn, s);
    for (uint32_t e = 0; e < c->n_experts; e++) s[e] = sigmoidf_(s[e]);
    /* Top-k by s + bias, ties to the lower id; the bias only selects. */
    for (uint32_t j = 0; j < c->top_k; j++) {
        int32_t best = -1; float bv = 0.0f;
        for (uint32_t e = 0; e < c->n_experts; e++) {
            int taken = 0;
            for (uint32_t t = 0; t < j; t++) if (sel[t] == (int32_t)e) { taken = 1; break; }
            if (taken) continue;
            float v = s[e] + L->router_bias[e];
            if (best < 0 || v > bv) { best = (int32_t)e; bv = v; }
        }
        sel[j] = best;
    }
    float sum = 0.0f;
    for (uint32_t j = 0; j < c->top_k; j++) { w[j] = s[sel[j]]; sum += w[j]; }
    for (uint32_t j = 0; j < c->top_k; j++) {
        if (c->renorm) w[j] /= (sum + 1e-20f);
        w[j] *= c->routed_scale;
    }
}

/* Whether a forward pass of n tokens guesses experts ahead (docs/ENGINE.md §5): decode only
 * (a guess never crosses into the next token), with reader threads to read the guesses, and
 * top_k within the guess buffers. */
static int guessing(const waste_ctx *ctx, uint32_t n) {
    return ctx->lookahead && ctx->io && n == 1 && ctx->c.cfg.top_k <= WE_REQS / 2;
}

/* Routes MoE layer L on xn and queues speculative reads of the first `ranks` experts it
 * selects (in the router's order, best first) that are neither cached nor being read
 * (router scratch buf[11]). */
static void guess_layer(waste_ctx *ctx, const wm_layer *L, const float *xn, uint32_t ranks) {
    int32_t gsel[WE_REQS / 2];
    float gw[WE_REQS / 2];
    route(ctx, L, xn, gsel, gw);
    for (uint32_t j = 0; j < ranks; j++) we_speculate(ctx, (uint32_t)L->bank, (uint32_t)gsel[j]);
}

/* How many of its top_k choices the first guess reads: its last quarter is confirmed far less
 * often (on the bench's model 58 % at rank 8 and 79 % at rank 7, against 90-100 % above), and
 * the second guess, one mixer before they are needed, reads those it confirms (docs/ENGINE.md
 * §5 Reading ahead; docs/DECISIONS.md has the measurements). */
static uint32_t first_guess_ranks(uint32_t top_k) { return top_k - top_k / 4; }

/* Decode lookahead (docs/ENGINE.md §5): route the next MoE layer after l on layer l's FFN
 * input (xn[0]) and queue speculative reads of its guesses that are not cached. Uses the
 * router's scratch (buf[11]) after layer l's own routing is done. */
static int32_t lookahead(waste_ctx *ctx, uint32_t l) {
    const wc_config *c = &ctx->c.cfg;
    uint32_t l2 = l + 1;
    while (l2 < c->n_layers && !ctx->layers[l2].is_moe) l2++;
    if (l2 >= c->n_layers) return WASTE_OK;
    guess_layer(ctx, &ctx->layers[l2], ctx->xn, first_guess_ranks(c->top_k));
    return WASTE_OK;
}

/* Lands fetched expert x's record (waiting for its read if needed) and points its matrices
 * into it. */
static int32_t expert_ready(waste_ctx *ctx, const wc_bank *b, wm_expert *x) {
    const uint8_t *rec = NULL;
    int32_t st = we_ready(ctx, x->slot, &rec);
    if (st) return st;
    const uint8_t *body = rec + 256;
    // record body: gate [I][R], up [I][R], down [R][I] (docs/FORMAT.md §5)
    for (int q = 0; q < 3; q++)
        x->m[q] = (wm_mat){b->fmt, b->group, b->rows[q], b->cols[q], wf_row_bytes(b->fmt, b->group, b->cols[q]),
                           body + b->block_off[q]};
    x->state = WM_EX_READY;
    return WASTE_OK;
}

/* Routed experts on x, or on z = latent_down·x under a latent MoE (docs/ENGINE.md §4.2.2), summed
 * in ascending expert id; the latent sum is optionally RMS-normed and projected up to H.
 * Shared experts (on x, unscaled) come last, then the sum joins the residual stream.
 *
 * The work is a list of tasks in summing order: each used expert in ascending id on each of
 * its tokens, then (without a latent) the shared experts on each token. Tasks [s, s + wave_cap)
 * own the wave buffers (task i: buffer i mod wave_cap) and may be computed in any order: a
 * wave (ffn_wave) is every one of them whose record has landed, and when none has, the first
 * one's record is waited for. After each wave the computed prefix of the list is added to the
 * sums in list order, so every token adds its experts in ascending id whatever order the reads
 * land in. A decode token's list fits in the buffers: its layer is one wave when every
 * expert is cached, and streaming, each wave takes whatever the reads have delivered. */
static int32_t moe_chunk(waste_ctx *ctx, uint32_t l, uint32_t n) {
    const wc_config *c = &ctx->c.cfg;
    const wm_layer *L = &ctx->layers[l];
    uint32_t H = c->hidden, k = c->top_k, R = c->rz ? c->rz : H, cap = ctx->wave_cap;
    /* The experts' input and their weighted sum: z and lacc [n][Rz] (latent), else xn and acc [n][H]. */
    float *ein = c->rz ? ctx->lz : ctx->xn, *eacc = c->rz ? ctx->lacc : ctx->acc;
    memset(ctx->expert_used, 0, c->n_experts);
    // xn, acc: [n][H]; sel, selw: [n][k]; expert_used: [E]; lz, lacc: [n][Rz]
    for (uint32_t t = 0; t < n; t++) {
        route(ctx, L, ctx->xn + (uint64_t)t * H, ctx->sel + (uint64_t)t * k, ctx->selw + (uint64_t)t * k);
        for (uint32_t j = 0; j < k; j++) ctx->expert_used[ctx->sel[(uint64_t)t * k + j]] = 1;
        if (c->rz) matvec(ctx, &L->lat_down, ctx->xn + (uint64_t)t * H, ctx->lz + (uint64_t)t * R);
        memset(eacc + (uint64_t)t * R, 0, R * sizeof(float));
    }
    /* The used experts ascending, and the tasks in summing order. */
    // exs: [m]; tasks: [n * (k + 1)]
    wm_expert *ex = ctx->exs;
    uint32_t m = 0, nt = 0;
    for (uint32_t e = 0; e < c->n_experts; e++)
        if (ctx->expert_used[e]) ex[m++] = (wm_expert){.id = (int32_t)e, .slot = -1};
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < k; j++)
                if (ctx->sel[(uint64_t)t * k + j] == ex[i].id) {
                    ctx->tasks[nt++] = (wm_task){(int32_t)i, t, ctx->selw[(uint64_t)t * k + j], 0};
                    ex[i].left++;
                }
    if (L->has_ffn && !c->rz)
        for (uint32_t t = 0; t < n; t++) ctx->tasks[nt++] = (wm_task){-1, t, 1.0f, 0};
    const wc_bank *b = &ctx->c.banks[L->bank];
    uint32_t bank = (uint32_t)L->bank;
    we_begin_layer(&ctx->cache, bank, ctx->expert_used);
    /* Reads: up to k of the layer's experts are pinned at once, fetched in ascending id, each
     * until its last task is computed (with io_threads all of a decode token's misses are
     * queued at once; k more slots stay for the next layer's guesses, so the window and those
     * fit the min cache, and a guess beyond them takes only a slot nothing pins); without
     * readers each miss is read on this thread as it is fetched. */
    uint32_t W = MIN(k, WE_REQS / 2), fetched = 0, pinned = 0, s = 0;
    /* Lookahead (decode only): the next MoE layer's router on this layer's FFN input guesses
     * its experts; their reads are queued behind this layer's. The real router still decides. */
    int guess = guessing(ctx, n), settled = 0;
    ffn_task wave[WM_WAVE_MAX];
    uint32_t widx[WM_WAVE_MAX];
    int32_t st = WASTE_OK;
    while (s < nt && st == WASTE_OK) {
        for (; pinned < W && fetched < m && st == WASTE_OK; fetched++, pinned++) {
            st = we_fetch(ctx, bank, (uint32_t)ex[fetched].id, &ex[fetched].slot);
            ex[fetched].state = WM_EX_FETCHED;
        }
        /* Every selected expert fetched: the layer's other guesses are settled before the next
         * layer's are queued (a guess no reader started is taken back, never read). */
        if (st == WASTE_OK && fetched == m && !settled) { settled = 1; if (ctx->lookahead) we_settle_guesses(ctx, bank); }
        if (st == WASTE_OK && guess) { guess = 0; st = lookahead(ctx, l); }
        /* The wave: every task of [s, s + cap) not yet computed whose record has landed. When
         * none has, the first one's record is waited for, then the others are looked at again. */
        uint32_t end = MIN(nt, s + cap), w = 0;
        for (int pass = 0; pass < 2 && w == 0 && st == WASTE_OK; pass++) {
            if (pass) {
                uint32_t p = s;
                while (ctx->tasks[p].done) p++;   /* s < nt and task s is not done */
                /* A routed expert (a shared task is always taken by the first pass), fetched:
                 * every expert below it is done and unpinned, so the window reached it. */
                if (ex[ctx->tasks[p].ex].state == WM_EX_FETCHED) st = expert_ready(ctx, b, &ex[ctx->tasks[p].ex]);
            }
            for (uint32_t p = s; p < end && st == WASTE_OK; p++) {
                const wm_task *tk = &ctx->tasks[p];
                if (tk->done) continue;
                wm_expert *x = tk->ex >= 0 ? &ex[tk->ex] : NULL;
                if (x && x->state == WM_EX_FETCHED && we_landed(ctx, x->slot)) st = expert_ready(ctx, b, x);
                if (st || (x && x->state != WM_EX_READY)) continue;
                wave[w] = x ? (ffn_task){.gate = &x->m[0], .up = &x->m[1], .down = &x->m[2], .x = ein + (uint64_t)tk->t * R}
                            : (ffn_task){.gate = &L->gate, .up = &L->up, .down = &L->down, .x = ctx->xn + (uint64_t)tk->t * H};
                wave[w].buf = p % cap;
                widx[w++] = p;
            }
        }
        if (st == WASTE_OK && w == 0) {   /* cannot happen (see above); never loop on it */
            wu_errf(ctx->err, sizeof ctx->err, "layer %u: no expert task could run (%u of %u summed)", l, s, nt);
            st = WASTE_E_STATE;
        }
        if (st) break;
        ffn_wave(ctx, wave, w);
        for (uint32_t i = 0; i < w; i++) {
            wm_task *tk = &ctx->tasks[widx[i]];
            tk->done = 1;
            /* An expert whose every task is computed gives its slot back. */
            if (tk->ex >= 0 && --ex[tk->ex].left == 0) { we_unpin(&ctx->cache, ex[tk->ex].slot); pinned--; }
        }
        /* The computed prefix joins the sums, in list order (a shared task's w is 1: y·1 is y). */
        for (; s < nt && ctx->tasks[s].done; s++) {
            const wm_task *tk = &ctx->tasks[s];
            float *a = (tk->ex < 0 ? ctx->acc + (uint64_t)tk->t * H : eacc + (uint64_t)tk->t * R);
            const float *y = ffn_out(ctx, s % cap);
            uint32_t rows = tk->ex < 0 ? L->down.rows : b->rows[2];
            for (uint32_t r = 0; r < rows; r++) a[r] += y[r] * tk->w;
        }
    }
    if (st) { we_drain(ctx); return st; }
    if (!settled && ctx->lookahead) we_settle_guesses(ctx, bank);
    // latent: lacc[t]: [Rz] -> (RMSNorm into buf[9]) -> acc[t]: [H]; then shared experts, then xs: [n][H] += acc
    for (uint32_t t = 0; t < n; t++) {
        float *a = ctx->acc + (uint64_t)t * H;
        if (c->rz) {
            const float *la = ctx->lacc + (uint64_t)t * R;
            if (L->lat_norm) { rmsnorm(ctx->buf[9], la, L->lat_norm, R, c->rms_eps); la = ctx->buf[9]; }
            matvec(ctx, &L->lat_up, la, a);
            if (L->has_ffn) {
                float *y = ctx->buf[8];
                swiglu(ctx, &L->gate, &L->up, &L->down, ctx->xn + (uint64_t)t * H, y);
                for (uint32_t i = 0; i < H; i++) a[i] += y[i];
            }
        }
        float *x = ctx->xs + (uint64_t)t * H;
        for (uint32_t i = 0; i < H; i++) x[i] += a[i];
    }
    return WASTE_OK;
}

/* ==== attention residuals ========================================================== */
/* Mix(P, 𝔅) (docs/ENGINE.md §4.2.3) for token t of the chunk: y = Σ_i softmax_i(s_i)·v_i over the
 * candidates v = [block 0 … block nb-1, p], s_i = Σ_c wn[c]·wp[c]·v_i[c] / sqrt(mean(v_i²) + ε),
 * on the unnormalised v, in f32. y aliases none of the inputs. */
static void res_mix(const waste_ctx *ctx, const float *p, uint32_t nb, uint32_t t, const float *wn, const float *wp,
                    float *y) {
    const wc_config *c = &ctx->c.cfg;
    uint32_t H = c->hidden;
    float sc[WC_MAX_LAYERS + 1];
    // blocks res: [n_blocks][chunk][H]; candidate i < nb is res[i][t], candidate nb is p: [H]
#define CAND(i) ((i) < nb ? ctx->res + ((uint64_t)(i) * ctx->prefill_chunk + t) * H : p)
    float mx = -INFINITY;
    for (uint32_t i = 0; i <= nb; i++) {
        const float *v = CAND(i);
        float dot = 0.0f, ss = 0.0f;
        for (uint32_t j = 0; j < H; j++) { dot += wn[j] * wp[j] * v[j]; ss += v[j] * v[j]; }
        sc[i] = dot / sqrtf(ss / (float)H + c->rms_eps);
        if (sc[i] > mx) mx = sc[i];
    }
    float sum = 0.0f;
    for (uint32_t i = 0; i <= nb; i++) { sc[i] = wn_expf(sc[i] - mx); sum += sc[i]; }
    for (uint32_t j = 0; j < H; j++) y[j] = 0.0f;
    for (uint32_t i = 0; i <= nb; i++) {
        const float *v = CAND(i);
        float w = sc[i] / sum;
        for (uint32_t j = 0; j < H; j++) y[j] += w * v[j];
    }
#undef CAND
}

/* The second guess (decode, docs/ENGINE.md §5): before MoE layer L's mixer, its own router on
 * the residual x as its FFN will see it without the mixer's output (mixed with the nb residual
 * blocks under attention residuals, then ffn_norm), into xm. It reads every expert it selects
 * that the first guess (one layer earlier, its top ranks only) did not: most of the rest,
 * from a closer state. Its reads queue behind the ones already queued for this layer. */
static void guess_again(waste_ctx *ctx, const wm_layer *L, const float *x, uint32_t nb) {
    const wc_config *c = &ctx->c.cfg;
    const float *src = x;
    if (c->res_block && nb) { res_mix(ctx, x, nb, 0, L->res_mlp_norm, L->res_mlp_proj, ctx->xm); src = ctx->xm; }
    rmsnorm(ctx->xm, src, L->ffn_norm, c->hidden, c->rms_eps);
    guess_layer(ctx, L, ctx->xm, c->top_k);
}

/* ==== forward ====================================================================== */
int32_t wm_forward(waste_ctx *ctx, const int32_t *ids, uint32_t n, int want_logits) {
    const wc_config *c = &ctx->c.cfg;
    uint32_t H = c->hidden, B = c->res_block, nb = 0;
    double t0 = wu_now_ms();
    // ids: [n] -> xs: [n][H] (the residual stream of the chunk; P under attention residuals)
    for (uint32_t t = 0; t < n; t++) {
        int32_t st = wc_read_embed_row(&ctx->c, ctx->embed, (uint32_t)ids[t], ctx->row_tmp, ctx->xs + (uint64_t)t * H,
                                       ctx->err, sizeof ctx->err);
        if (st) return st;
    }
    /* The mixer output borrows acc's first row: the FFN refills acc only after the mixers. */
    float *mix = ctx->acc;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const wm_layer *L = &ctx->layers[l];
        int push = B && l % B == 0;
        // mixer token by token (recurrent): x: [H], xin = xn[0]: [H], o = acc[0]: [H]
        for (uint32_t t = 0; t < n; t++) {
            float *x = ctx->xs + (uint64_t)t * H, *xin = ctx->xn, *o = mix;
            /* Attention residuals (docs/ENGINE.md §4.2.3): the input is Mix(P, 𝔅) once 𝔅 is not
             * empty; at a block start P is pushed onto 𝔅 and restarts at 0, after the mix. */
            const float *src = x;
            if (L->is_moe && guessing(ctx, n)) guess_again(ctx, L, x, nb);
            if (B && nb) { res_mix(ctx, x, nb, t, L->res_attn_norm, L->res_attn_proj, ctx->xm); src = ctx->xm; }
            rmsnorm(xin, src, L->attn_norm, H, c->rms_eps);
            if (push) {
                // res[nb][t]: [H] <- P; P <- 0
                memcpy(ctx->res + ((uint64_t)nb * ctx->prefill_chunk + t) * H, x, H * sizeof(float));
                memset(x, 0, H * sizeof(float));
            }
            if (L->is_mla) mla_step(ctx, l, xin, ctx->pos + t, o);
            else kda_step(ctx, l, xin, o);
            for (uint32_t i = 0; i < H; i++) x[i] += o[i];
        }
        nb += push;
        // FFN input for the whole chunk: xn: [n][H] (from Mix(P, 𝔅) under attention residuals)
        for (uint32_t t = 0; t < n; t++) {
            const float *src = ctx->xs + (uint64_t)t * H;
            if (B) { res_mix(ctx, src, nb, t, L->res_mlp_norm, L->res_mlp_proj, ctx->xm); src = ctx->xm; }
            rmsnorm(ctx->xn + (uint64_t)t * H, src, L->ffn_norm, H, c->rms_eps);
        }
        if (L->is_moe) {
            int32_t st = moe_chunk(ctx, l, n);
            if (st) return st;
        } else {
            for (uint32_t t = 0; t < n; t++) {
                float *y = ctx->buf[8];
                swiglu(ctx, &L->gate, &L->up, &L->down, ctx->xn + (uint64_t)t * H, y);
                float *x = ctx->xs + (uint64_t)t * H;
                for (uint32_t i = 0; i < H; i++) x[i] += y[i];
            }
        }
    }
    if (ctx->lookahead) we_land_guesses(ctx);
    for (uint32_t t = 0; t < n; t++) ctx->ids[ctx->pos + t] = ids[t];
    ctx->pos += n;
    if (want_logits) {
        float *h = ctx->buf[0];
        // last position only: (output mix xm: [H]) -> h: [H] -> logits: [V]
        const float *last = ctx->xs + (uint64_t)(n - 1) * H;
        if (B) { res_mix(ctx, last, nb, n - 1, ctx->out_res_norm, ctx->out_res_proj, ctx->xm); last = ctx->xm; }
        rmsnorm(h, last, ctx->final_norm, H, c->rms_eps);
        matvec(ctx, &ctx->lm_head, h, ctx->logits);
        ctx->has_logits = 1;
    } else {
        ctx->has_logits = 0;
    }
    atomic_fetch_add(&ctx->st_tokens, n);
    atomic_fetch_add(&ctx->st_compute_us, (uint64_t)((wu_now_ms() - t0) * 1000.0));
    return WASTE_OK;
}
