/* engine.h — the context (struct waste_ctx) and the components that work on it: model
 * binding and forward pass (model.c), the expert store (experts.c), the hotlist
 * (hotlist.c), the sampler (sampler.c). Not public. Their shared utilities (error detail,
 * memory accounting, busy guard) are in context.h. */
#ifndef WASTE_ENGINE_H
#define WASTE_ENGINE_H

#include "internal.h"
#include "io.h"

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
    /* K3 deltas (docs/ENGINE.md §4.2); unbound (zero) when their config key is off */
    wm_mat kda_g;                   /* use_full_rank_gate: [Hd, H] replaces g_a/g_b */
    wm_mat mla_g;                   /* mla_use_output_gate: [h·dv, H] */
    wm_mat lat_down, lat_up;        /* latent MoE: [Rz, H], [H, Rz] */
    const float *lat_norm;          /* [Rz] with latent_moe_use_norm */
    const float *res_attn_norm, *res_attn_proj, *res_mlp_norm, *res_mlp_proj;   /* [H] each */
} wm_layer;

/* Reads in flight at once at most: a layer's window of misses plus the next layer's guesses. */
#define WE_REQS 128

/* A slot's guess state (we_cache.spec): none; a guess waiting for its layer's router; a guess
 * its layer did not select whose read is still in flight (pinned until it lands). */
enum { WE_SPEC_NONE = 0, WE_SPEC_GUESS = 1, WE_SPEC_LEFT = 2 };

/* Expert slots (docs/ENGINE.md §5). The per-slot arrays and the (bank, expert) tables are all
 * sized for every expert of the container (n_all), so their bytes are a fixed part of the
 * plan's state and the budget holds exactly; only n_slots of the slot entries are used. */
typedef struct {
    uint8_t *mem;
    uint64_t slot_bytes;
    uint32_t n_slots;
    uint32_t n_experts;             /* per bank: (bank, expert) -> bank * n_experts + expert */
    uint64_t n_all;                 /* n_banks * n_experts */
    int32_t *bank, *expert;         /* per slot; -1 when empty */
    uint64_t *last_use, *hits;
    uint32_t *pin;
    int32_t *slot_of;               /* per (bank, expert): its slot or -1 */
    uint64_t *counts;               /* per (bank, expert): accesses, merged with the hotlist */
    int32_t *req;                   /* per slot: its read in flight (index into reqs) or -1 */
    uint8_t *spec;                  /* per slot: WE_SPEC_*: a lookahead guess not yet confirmed */
    wi_req reqs[WE_REQS];           /* reads in flight through the reader pool */
    int32_t free_req[WE_REQS];
    uint32_t n_free;
    int32_t victim_guess_bank;      /* we_lookup: the bank of an unconfirmed guess it evicted, or -1 */
    uint64_t tick;
    uint64_t rng;
    int32_t policy;
    uint32_t n_banks;
    uint32_t cur_bank;              /* LAYER: the bank being computed (we_begin_layer) */
    const uint8_t *needed;          /* LAYER: [n_experts] this token's selection in cur_bank, or NULL */
    atomic_uint used;               /* slots filled so far; read by waste_get_stats */
    uint64_t held_bytes;            /* what we_init allocated (slots + tables) */
} we_cache;

/* Bytes of the expert tables for n_all (bank, expert) pairs: the slot entries plus the
 * slot map and the access counts. Shared by the plan (state) and we_init. */
uint64_t we_table_bytes(uint64_t n_all);

/* One FFN of a MoE layer's work list (model.c moe_chunk): the layer's ex-th used expert (-1: the
 * shared experts) on token t of the chunk, its output scaled by w. */
typedef struct { int32_t ex; uint32_t t; float w; int done; } wm_task;
/* A used expert of a MoE layer (model.c moe_chunk): its id, its slot once fetched, its tasks
 * not yet computed, and its matrices in the slot once its record is ready. */
enum { WM_EX_WAITING = 0, WM_EX_FETCHED, WM_EX_READY };
typedef struct { int32_t id, slot; uint32_t left; int state; wm_mat m[3]; } wm_expert;
/* FFNs in one wave (two fork-joins) at most: a decode token's routed experts and its shared ones. */
#define WM_WAVE_MAX 32

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
    int act_q8;                     /* cfg.activations == WASTE_ACT_Q8 */
    wp_pool *pool;
    wt_tokenizer *tok;
    int dir_lock_fd;
    int *cpus;                      /* cfg.cpu_list parsed; NULL when unset */
    uint32_t n_cpus;

    /* bound weights */
    wm_layer *layers;
    wm_mat lm_head;
    const float *final_norm;
    const float *out_res_norm, *out_res_proj;   /* attention residuals' output mix: [H] */
    const wc_tensor *embed;

    /* state */
    uint64_t pos;
    int32_t *ids;                   /* [ctx_tokens] */
    float **conv;                   /* per KDA layer: [3][Hd][K-1], oldest tap first */
    float **S;                      /* per KDA layer: [Hk][d][d] (key row, value col) */
    float **lat;                    /* per MLA layer: [ctx_tokens][r + dr] */
    /* The snapshot segment this state extends (snapshot.c, docs/FORMAT.md §7.1): the last
     * one saved or chain-loaded; eval/generate only append, so it stays valid until a
     * reset (wm_reset_state) or a whole-snapshot load clears it. */
    int seg_anchored;
    uint64_t seg_pos;               /* its position P */
    uint32_t seg_crc;               /* its trailing crc32 */

    /* scratch */
    uint32_t maxw;
    float *xs;                      /* [chunk][H] residual stream of a chunk */
    float *xn;                      /* [chunk][H] normed FFN inputs of a chunk */
    float *acc;                     /* [chunk][H] FFN outputs of a chunk */
    float *buf[12];                 /* [maxw] each */
    int8_t *xq;                     /* [2][maxw] two matvec inputs quantized (WASTE_ACT_Q8) */
    float *xd;                      /* [2][maxw / 32 + 1] their block scales */
    /* FFN waves (model.c ffn_wave): wave_cap tasks of width ffn_w (the widest FFN input,
     * hidden or output), each with g, u, y floats, its gate input and act(g, u) quantized. */
    uint32_t wave_cap, ffn_w;
    float *wave_f;                  /* [wave_cap][3][ffn_w] g, u, y */
    int8_t *wave_q;                 /* [wave_cap][2][ffn_w] act(g, u), input (quantized) */
    float *wave_d;                  /* [wave_cap][2][ffn_w / 32 + 1] their block scales */
    wm_task *tasks;                 /* [chunk][top_k + 1] a MoE layer's work list */
    wm_expert *exs;                 /* [n_experts] a MoE layer's used experts, ascending */
    float *xm;                      /* [H] an attention-residual mix (never aliases its inputs) */
    float *res;                     /* [n_blocks][chunk][H] attention-residual block snapshots */
    float *lz, *lacc;               /* [chunk][Rz] latent MoE: z, and the experts' weighted sum */
    float *scores;                  /* [mla_heads][ctx_tokens] each MLA head's scores */
    float *logits;                  /* [vocab] */
    int has_logits;
    int32_t *sel;                   /* [chunk][top_k] */
    float *selw;                    /* [chunk][top_k] */
    uint8_t *expert_used;           /* [n_experts] */
    uint8_t *row_tmp;               /* one embedding row */
    struct ws_pair *sample_pairs;   /* [2 * vocab] the sampler's work area */

    we_cache cache;
    wm_sizing sizing;

    /* statistics (atomics: read from any thread) */
    atomic_uint_least64_t st_tokens, st_hits, st_misses, st_reads, st_bytes, st_compute_us, st_io_us;
    atomic_uint_least64_t st_guesses, st_guess_hits, st_wasted_bytes, st_wait_us;
    wi_pool *io;                    /* cfg.io_threads readers, or NULL: reads on the calling thread */
    uint32_t io_threads, lookahead;
    int direct_all;
    char io_note[160];
    /* memory accounting: bytes held now and the high-water mark (engine allocations only) */
    atomic_uint_least64_t mem_now, mem_peak;
    /* hotlist (hotlist.c): where usage.waste lives ("" = none) and what open made of it */
    char usage_path[1100];
    atomic_uint_least64_t st_warm_bytes;
    uint64_t usage_entries, usage_skipped, warm_slots;
    char usage_note[160];
    /* per-call counters */
    uint64_t call_hits, call_misses, call_bytes;
    double call_io_ms;
};

/* model.c */
int32_t wm_sizing_compute(const wc_container *c, uint32_t ctx_tokens, uint32_t chunk, uint64_t budget_cfg,
                          wm_sizing *s, char *err, uint64_t cap);
int32_t wm_bind(waste_ctx *ctx, char *err, uint64_t cap);
/* Allocates state and scratch; *bytes = what it allocated (also on failure). */
int32_t wm_alloc_state(waste_ctx *ctx, uint64_t *bytes, char *err, uint64_t cap);
void wm_free_state(waste_ctx *ctx);
void wm_reset_state(waste_ctx *ctx);
/* Evaluates n tokens (n <= prefill_chunk) at ctx->pos; logits of the last if want_logits. */
int32_t wm_forward(waste_ctx *ctx, const int32_t *ids, uint32_t n, int want_logits);
uint64_t wm_params_total(const waste_ctx *ctx);
uint64_t wm_params_active(const waste_ctx *ctx);

/* experts.c */
int32_t we_init(we_cache *c, uint64_t slot_bytes, uint32_t n_slots, uint32_t n_banks, uint32_t n_experts,
                int32_t policy, uint64_t seed);
void we_free(we_cache *c);
/* Starts fetching (bank b, expert e) and pins its slot (*slot): a hit, or a miss read into a
 * victim slot on this thread (no readers) or queued to the reader pool. we_ready then waits
 * for the read if needed and gives the record; we_unpin releases the slot after use. */
int32_t we_fetch(waste_ctx *ctx, uint32_t bank, uint32_t e, int32_t *slot);
int32_t we_ready(waste_ctx *ctx, int32_t slot, const uint8_t **rec);
/* Whether we_ready on slot would return at once (its read, if any, has finished). */
int we_landed(const waste_ctx *ctx, int32_t slot);
void we_unpin(we_cache *c, int32_t slot);
/* Lookahead: queues a speculative read of (bank, e) into an evictable slot, pinned while in
 * flight; nothing when it is cached, no slot or request is free, or there are no readers. */
void we_speculate(waste_ctx *ctx, uint32_t bank, uint32_t e);
/* Once bank's layer has fetched every expert it selects: its other guesses are taken back
 * when no reader has started them, released (and counted as wasted) when landed, else left
 * to land pinned; guesses left earlier that have landed are released. Never waits. */
void we_settle_guesses(waste_ctx *ctx, uint32_t bank);
/* At the end of a forward pass: waits for the guesses left in flight and releases them, so
 * no read is in flight between passes. */
void we_land_guesses(waste_ctx *ctx);
/* Lands every read in flight and releases every pin (after a failed or aborted pass). */
void we_drain(waste_ctx *ctx);
/* The policy without I/O (we_get is lookup, read, install): counts the access; on a hit pins
 * and returns the slot; on a miss returns -1 with *victim = the emptied slot the record must
 * be read into (-1: none evictable). we_install maps it (pinned, 1 hit) once it is read. */
int32_t we_lookup(we_cache *c, uint32_t bank, uint32_t e, int32_t *victim);
void we_install(we_cache *c, int32_t s, uint32_t bank, uint32_t e);
/* Tells the LAYER policy which bank is being computed and which of its experts the current
 * token(s) select (needed[e] != 0; NULL = unknown); kept until the next call. */
void we_begin_layer(we_cache *c, uint32_t bank, const uint8_t *needed);
void we_unpin_all(we_cache *c);
/* Fills empty slots from the highest access counts (ties: lower layer, then lower expert);
 * warmed slots start at 1 hit. Counts the reads in st_warm_bytes. */
int32_t we_warm(waste_ctx *ctx, char *err, uint64_t cap);

/* hotlist.c (docs/FORMAT.md §8) */
/* Resolves cfg.usage_path into ctx->usage_path: NULL -> <container>/usage.waste, "" -> none. */
int32_t wh_set_path(waste_ctx *ctx, const char *cfg_path, char *err, uint64_t cap);
/* Merges ctx->usage_path into the counts when it exists and is valid; never fails: a bad
 * header, fingerprint or size ignores the file, bad entries are skipped (usage_note says why). */
void wh_load(waste_ctx *ctx);
/* Writes the counts to path via a temp file + rename; the detail names the file on failure. */
int32_t wh_save(waste_ctx *ctx, const char *path);

/* sampler.c */
typedef struct { uint64_t s[4]; } ws_rng;
void ws_seed(ws_rng *r, uint64_t seed);
double ws_uniform(ws_rng *r);
/* (value, id) pairs the sampler orders; value first so a pair is 16 bytes. */
struct ws_pair { double v; int32_t id; int32_t pad; };
/* Samples from logits[0..n) (docs/ENGINE.md §2); work holds 2n pairs (ctx->sample_pairs),
 * so nothing is allocated per token. *logprob = the log-softmax of logits at the id. */
int32_t ws_sample(struct ws_pair *work, const float *logits, uint32_t n, const waste_gen_params *p, ws_rng *r,
                  float *logprob);
/* Logit processing in place, in order: logit bias, repetition penalty (ids with seen[j] or
 * counts[j]), frequency and presence penalties (counts[j] = generated this call), then -inf
 * for every id whose bit in allowed is clear. counts, seen, allowed may be NULL (that step
 * off). With default params and NULLs nothing is written. */
void ws_adjust(float *logits, uint32_t n, const waste_gen_params *p, const uint32_t *counts,
               const uint8_t *seen, const uint32_t *allowed);
/* The k (<= n) most likely ids of logits, descending (ties: lower id), with their
 * log-softmax; NaN and -inf never listed. Returns how many were written. */
uint32_t ws_top(const float *logits, uint32_t n, uint32_t k, int32_t *ids, float *lps);

#endif
