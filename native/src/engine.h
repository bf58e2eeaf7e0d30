/* engine.h — the context and the components that work on it: model binding and forward
 * pass (model.c), the expert store (experts.c), the sampler (sampler.c). Not public. */
#ifndef WASTE_ENGINE_H
#define WASTE_ENGINE_H

#include "internal.h"

typedef struct wt_tokenizer wt_tokenizer;

typedef struct {
    int is_mla, is_moe, bank;
    const float *attn_norm, *ffn_norm;
    /* KDA */
    wm_mat q_proj, k_proj, v_proj, f_a, f_b, b_proj, g_a, g_b, o_proj;
    const float *conv[3];           /* q, k, v taps: [Hd, K] */
    const float *a_log, *dt_bias, *o_norm;
    /* MLA */
    wm_mat mq, mq_a, mq_b, kv_a, kv_b, mo;
    const float *q_a_norm, *kv_a_norm;
    /* dense FFN or shared experts */
    wm_mat gate, up, down;
    int has_ffn;
    /* MoE router (f32) */
    wm_mat router;
    const float *router_bias;
} wm_layer;

/* Expert slots (engine.md §5); the policy is simple in v1 but the index/pin/hit fields
 * are the ones the later LFRU cache needs. */
typedef struct {
    uint8_t *mem;
    uint64_t slot_bytes;
    uint32_t n_slots;
    int32_t *layer, *expert;
    uint64_t *last_use, *hits;
    uint32_t *pin;
    uint64_t tick;
    uint64_t rng;
    int32_t policy;
    atomic_uint used;               /* slots filled so far; read by waste_get_stats */
} we_cache;

typedef struct {
    uint64_t trunk, state, scratch, vision, min_cache, floor, working_set, experts;
    uint64_t recommended, auto_budget, usable, budget, record, slots;
} wm_sizing;

struct waste_ctx {
    atomic_int busy;
    atomic_int abort_flag;
    int poisoned;
    int tokenizer_only;
    char err[WASTE_ERR_CAP];

    uint32_t ctx_tokens, prefill_chunk, n_threads, verify;
    wc_container c;
    const wk_kernels *k;
    wp_pool *pool;
    wt_tokenizer *tok;
    int dir_lock_fd;
    int *cpus;                      /* cfg.cpu_list parsed; NULL when unset */
    uint32_t n_cpus;

    /* bound weights */
    wm_layer *layers;
    wm_mat lm_head;
    const float *final_norm;
    const wc_tensor *embed;

    /* state */
    uint64_t pos;
    int32_t *ids;                   /* [ctx_tokens] */
    float **conv;                   /* per KDA layer: [3][Hd][K-1], oldest tap first */
    float **S;                      /* per KDA layer: [Hk][d][d] (key row, value col) */
    float **lat;                    /* per MLA layer: [ctx_tokens][r + dr] */

    /* scratch */
    uint32_t maxw;
    float *xs;                      /* [chunk][H] residual stream of a chunk */
    float *xn;                      /* [chunk][H] normed FFN inputs of a chunk */
    float *acc;                     /* [chunk][H] FFN outputs of a chunk */
    float *buf[12];                 /* [maxw] each */
    float *scores;                  /* [ctx_tokens] */
    float *logits;                  /* [vocab] */
    int has_logits;
    int32_t *sel;                   /* [chunk][top_k] */
    float *selw;                    /* [chunk][top_k] */
    uint8_t *expert_used;           /* [n_experts] */
    uint8_t *row_tmp;               /* one embedding row */
    struct ws_pair *sample_pairs;   /* [vocab] (value, id) for sorting */

    we_cache cache;
    wm_sizing sizing;

    /* statistics (atomics: read from any thread) */
    atomic_uint_least64_t st_tokens, st_hits, st_misses, st_reads, st_bytes, st_compute_us, st_io_us;
    int direct_all;
    char io_note[160];
    uint64_t allocated, peak;
    /* per-call counters */
    uint64_t call_hits, call_misses, call_bytes;
    double call_io_ms;
};

/* model.c */
int32_t wm_sizing_compute(const wc_container *c, uint32_t ctx_tokens, uint32_t chunk, uint64_t budget_cfg,
                          wm_sizing *s, char *err, uint64_t cap);
int32_t wm_bind(waste_ctx *ctx, char *err, uint64_t cap);
int32_t wm_alloc_state(waste_ctx *ctx, char *err, uint64_t cap);
void wm_free_state(waste_ctx *ctx);
void wm_reset_state(waste_ctx *ctx);
/* Evaluates n tokens (n <= prefill_chunk) at ctx->pos; logits of the last if want_logits. */
int32_t wm_forward(waste_ctx *ctx, const int32_t *ids, uint32_t n, int want_logits);
uint64_t wm_params_total(const waste_ctx *ctx);
uint64_t wm_params_active(const waste_ctx *ctx);

/* experts.c */
int32_t we_init(we_cache *c, uint64_t slot_bytes, uint32_t n_slots, int32_t policy, uint64_t seed);
void we_free(we_cache *c);
/* Returns the record of (layer bank b, expert e), loading it on a miss; pins the slot. */
int32_t we_get(waste_ctx *ctx, uint32_t bank, uint32_t e, const uint8_t **rec);
void we_unpin_all(we_cache *c);

/* sampler.c */
typedef struct { uint64_t s[4]; } ws_rng;
void ws_seed(ws_rng *r, uint64_t seed);
double ws_uniform(ws_rng *r);
int32_t ws_sample(waste_ctx *ctx, const float *logits, uint32_t n, const waste_gen_params *p, ws_rng *r, float *logprob);

/* ctx error helper */
void wx_err(waste_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
