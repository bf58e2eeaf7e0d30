/*
 * waste.h — the public interface of libwaste, the only header a client includes.
 *
 * Boundary. libwaste is a library first: C11 + POSIX, linking only libc, libm and
 * pthreads. It loads one model container (`model.waste/`, see docs/FORMAT.md), runs
 * the forward pass on the CPU, tokenizes, samples and snapshots. It never prints,
 * never exits or aborts, installs no signal handlers, reads no environment variables
 * and keeps no mutable globals apart from one-time CPU feature detection. Its
 * clients are the Python server (cffi), the C test drivers and tools/bench.
 *
 * Errors. Every fallible call returns an int32_t status (WASTE_OK or a negative
 * WASTE_E_*). The detail text comes from waste_last_error(ctx), which is never NULL
 * and stays valid until the next call on that ctx; calls without a ctx (plan, open)
 * write it into the caller's `err`/`err_cap` buffer instead (always NUL-terminated
 * when err_cap > 0). Details name the file, offset, layer, expert, tensor or field.
 * E_IO, E_FORMAT or E_NOMEM during eval/generate poison the ctx: eval, generate and
 * snapshot_save then return E_STATE until waste_reset. Other failures leave the ctx
 * unchanged.
 *
 * Threads. A ctx is not thread-safe; an atomic in-call flag turns concurrent or
 * re-entrant use into E_BUSY. waste_abort, waste_get_stats and waste_get_model_info may
 * be called from any thread at any time (inside the token callback only abort and
 * get_stats are allowed). Contexts share nothing.
 *
 * Ownership. The library owns the waste_ctx (free it with waste_close, NULL-safe) and
 * every `const char *` it returns (static strings, or ctx-owned text valid until the
 * next call). The caller owns every buffer it passes in; the library never keeps a
 * pointer to one after the call returns. waste_token_info.piece is valid only during
 * the callback. Structs carry `struct_size` first: call the matching _init function
 * before use, a wrong size returns E_ARG.
 *
 * Usage:
 *
 *     waste_cfg cfg; waste_cfg_init(&cfg);
 *     cfg.ctx_tokens = 8192;
 *     char err[512]; waste_ctx *ctx = NULL;
 *     if (waste_open("model.waste", &cfg, &ctx, err, sizeof err) != WASTE_OK) {
 *         fprintf(stderr, "%s\n", err); return 1;
 *     }
 *     int32_t ids[4096]; uint64_t n = 0;
 *     waste_tokenize(ctx, text, strlen(text), 0, ids, 4096, &n);
 *     waste_gen_params gp; waste_gen_params_init(&gp);
 *     gp.temperature = 0.0f; gp.max_tokens = 128;
 *     waste_gen_result res; waste_gen_result_init(&res);
 *     int32_t st = waste_generate(ctx, ids, n, &gp, on_token, user, &res);
 *     if (st != WASTE_OK) fprintf(stderr, "%s\n", waste_last_error(ctx));
 *     waste_close(ctx);
 *
 * Everything between the CDEF markers is handed to cffi's cdef verbatim: only
 * typedefs, structs, enums with explicit values, prototypes and `#define NAME <int>`,
 * over fixed-width types. Keep it that way.
 */
#ifndef WASTE_H
#define WASTE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* WASTE_CDEF_BEGIN */

#define WASTE_API_VERSION 2

/* Status codes (engine.md §1). */
typedef enum {
    WASTE_OK = 0,
    WASTE_E_IO = -1,          /* missing file, short read, crc error */
    WASTE_E_FORMAT = -2,      /* bad container, record or snapshot */
    WASTE_E_BUDGET = -3,      /* below the floor, above usable RAM, no evictable slot */
    WASTE_E_NOMEM = -4,
    WASTE_E_ARG = -5,         /* NULL, out of range, invalid UTF-8, bad struct_size */
    WASTE_E_UNSUPPORTED = -6,
    WASTE_E_CANCELLED = -7,   /* waste_abort was honoured */
    WASTE_E_BUSY = -8,        /* container locked, or a concurrent/re-entrant call */
    WASTE_E_STATE = -9,       /* ctx poisoned; waste_reset clears it */
    WASTE_E_SPACE = -10,      /* buffer too small; *n_out = the size needed */
    WASTE_E_CTX = -11         /* does not fit ctx_tokens; nothing was evaluated */
} waste_status;

typedef enum {
    WASTE_STOP_NONE = 0,
    WASTE_STOP_TOKEN = 1,      /* a stop id was sampled (and delivered) */
    WASTE_STOP_MAX_TOKENS = 2, /* max_tokens were delivered */
    WASTE_STOP_CTX_FULL = 3,   /* the next evaluation would not fit ctx_tokens */
    WASTE_STOP_CALLBACK = 4    /* the token callback returned non-zero */
} waste_stop_reason;

typedef enum {
    WASTE_CACHE_LFRU = 0,
    WASTE_CACHE_LRU = 1
} waste_cache_policy;

typedef enum {
    WASTE_KERNELS_AUTO = 0,    /* best of avx512 / avx2 / generic detected at runtime */
    WASTE_KERNELS_GENERIC = 1  /* portable C; bit-identical results by construction */
} waste_kernels;

typedef struct waste_ctx waste_ctx;

/* Open-time options. waste_cfg_init fills the defaults shown in brackets. */
typedef struct {
    uint32_t struct_size;
    uint32_t ctx_tokens;        /* [0 -> 4096] maximum position */
    uint64_t ram_budget_bytes;  /* [0 = auto, engine.md §5] */
    uint32_t n_threads;         /* [0 = one per allowed CPU] */
    int32_t cache_policy;       /* [WASTE_CACHE_LFRU] */
    const char *cpu_list;       /* [NULL] e.g. "0-3,6"; Linux only; copied at open */
    int32_t direct_io;          /* [1] O_DIRECT bank reads, buffered fallback reported */
    int32_t verify;             /* [0] crc32 of every record read */
    int32_t vision;             /* [0] non-zero returns E_UNSUPPORTED for now */
    int32_t exclusive_open;     /* [0] flock on the container directory */
    const char *usage_path;     /* [NULL = <container>/usage.waste; "" = none] the hotlist
                                 * (docs/FORMAT.md §8): read at open if it exists, a hint
                                 * only (a bad header, fingerprint or size ignores it, bad
                                 * entries are skipped, never an open failure; see
                                 * waste_stats.usage_note); its counts are merged and the
                                 * hottest experts warm the slots. Also save_usage's default
                                 * target. Copied at open. */
    uint32_t prefill_chunk;     /* [0 -> 64; 1 = token by token] */
    uint32_t io_threads;        /* [0] non-zero returns E_UNSUPPORTED for now */
    uint32_t lookahead;         /* [0] non-zero returns E_UNSUPPORTED for now */
    int32_t tokenizer_only;     /* [0] load the tokenizer and manifest only */
    int32_t kernels;            /* [WASTE_KERNELS_AUTO] */
} waste_cfg;

/* Memory plan (engine.md §5): what open would allocate, from the manifest alone. */
typedef struct {
    uint32_t struct_size;
    uint32_t reserved0;
    uint64_t trunk_bytes;       /* resident tensors */
    uint64_t state_bytes;       /* KDA state + conv rings + MLA latents at ctx_tokens */
    uint64_t scratch_bytes;     /* activations, logits, chunk buffers */
    uint64_t vision_bytes;
    uint64_t min_cache_bytes;   /* 2 * top_k * record_bytes */
    uint64_t floor_bytes;       /* trunk + state + scratch + vision + min cache */
    uint64_t working_set_bytes; /* n_moe_layers * top_k * record_bytes */
    uint64_t expert_bytes;      /* every record of every bank */
    uint64_t recommended_bytes;
    uint64_t auto_bytes;
    uint64_t usable_ram_bytes;
    uint64_t budget_bytes;      /* the budget open would use */
    uint64_t record_bytes;      /* slot size (largest record) */
    uint64_t slots;             /* expert slots open would allocate */
} waste_plan;

typedef struct {
    uint32_t struct_size;
    char arch[32];              /* "kimi_linear" */
    uint32_t n_layers;
    uint32_t n_moe_layers;
    uint32_t n_kda_layers;
    uint32_t n_mla_layers;
    uint32_t n_experts;
    uint32_t top_k;
    uint32_t n_shared_experts;
    uint32_t hidden;
    uint32_t vocab;             /* rows of the embedding / lm_head */
    uint32_t n_base_vocab;      /* ids >= this are specials; 0 without a tokenizer */
    uint32_t ctx_max;           /* ctx_tokens of this ctx */
    uint32_t ctx_train;         /* from the config (model_max_length) */
    uint64_t params_total;
    uint64_t params_active;     /* non-routed weights minus the embedding + k experts/layer */
    int32_t bos_id;             /* -1 when unknown */
    int32_t eos_id;
    int32_t media_placeholder_id;
    int32_t has_vision;
    int32_t has_tokenizer;
    uint32_t reserved0;
    uint64_t record_bytes;
    char quant[64];             /* e.g. "trunk=bf16 experts=int8g32" */
} waste_model_info;

typedef struct {
    uint32_t struct_size;
    float temperature;          /* [0.0] 0 = greedy (argmax, ties to the lower id) */
    float top_p;                /* [1.0] */
    uint32_t top_k;             /* [0 = off] */
    uint64_t seed;              /* [0] xoshiro256** seeded by splitmix64(seed) per call */
    uint32_t max_tokens;        /* [0 = until a stop id or the context is full] */
    uint32_t n_stop_ids;        /* [0] */
    const int32_t *stop_ids;    /* [NULL] read during the call only */
} waste_gen_params;

/* Passed to the token callback; valid only during the callback. */
typedef struct {
    uint32_t struct_size;
    uint32_t index;             /* 0-based index of the generated token */
    int32_t token;
    int32_t is_stop;
    float logprob;              /* log-softmax of the raw logits at `token` */
    uint32_t experts_hit;       /* for the pass that produced this token */
    uint32_t experts_missed;    /* (index 0 includes the prefill) */
    uint32_t piece_len;
    uint64_t bytes_read;
    double ms;
    double io_ms;
    const char *piece;          /* UTF-8; an incomplete tail is held for a later piece */
                                /* empty for an id with no text (vocab padding) */
} waste_token_info;

typedef int32_t (*waste_token_cb)(const waste_token_info *info, void *user);

typedef struct {
    uint32_t struct_size;
    uint32_t prompt_tokens;     /* prompt tokens evaluated by this call */
    uint32_t tokens_generated;  /* tokens delivered to the callback */
    int32_t stop_reason;        /* waste_stop_reason */
    uint64_t experts_hit;
    uint64_t experts_missed;
    uint64_t bytes_read;
    double prefill_ms;
    double decode_ms;
    int32_t direct_io;
    uint32_t reserved0;
} waste_gen_result;

/* Cumulative since open; filled from atomics, callable from any thread. */
typedef struct {
    uint32_t struct_size;
    int32_t direct_io;          /* 1 only if every bank bypasses the page cache */
    uint64_t tokens;            /* tokens evaluated */
    uint64_t hits;              /* expert accesses served from a slot */
    uint64_t misses;            /* expert accesses that read a record */
    uint64_t reads;
    uint64_t bytes_read;        /* by misses (warming is counted in warm_bytes only) */
    uint64_t warm_bytes;        /* records read at open to warm the slots from the hotlist */
    double compute_s;
    double io_s;
    uint64_t budget_bytes;
    uint64_t allocated_bytes;   /* engine buffers held now: trunk, state (incl. the expert
                                 * tables), scratch, expert slots, plus any transient buffer;
                                 * measured at the allocation sites. Right after open it
                                 * equals the plan's floor - min cache + slots * record. */
    uint64_t peak_bytes;        /* high-water mark of allocated_bytes since open, including
                                 * transient buffers (O_DIRECT probe, hotlist load/ranking,
                                 * generated pieces). Not counted: the tokenizer's tables and
                                 * per-call tokenize scratch, and small fixed bookkeeping. */
    uint64_t slots_total;
    uint64_t slots_used;
    char io_note[160];          /* why direct_io is 0; empty otherwise */
    uint64_t usage_entries;     /* hotlist entries merged at open */
    uint64_t usage_skipped;     /* hotlist entries skipped (no such MoE layer/expert, count 0) */
    uint64_t warm_slots;        /* slots warmed at open (warm_bytes in records) */
    char usage_note[160];       /* why the hotlist was ignored or entries skipped; empty when
                                 * it was read cleanly, absent, or usage_path is "" */
} waste_stats;

/* Static calls: safe from any thread. */
const char *waste_version(void);
uint32_t waste_api_version(void);
const char *waste_build_info(void);
const char *waste_status_name(int32_t status);
uint64_t waste_usable_ram(void);

void waste_cfg_init(waste_cfg *cfg);
void waste_plan_init(waste_plan *plan);
void waste_model_info_init(waste_model_info *info);
void waste_gen_params_init(waste_gen_params *params);
void waste_gen_result_init(waste_gen_result *res);
void waste_stats_init(waste_stats *stats);

int32_t waste_plan_memory(const char *path, const waste_cfg *cfg, waste_plan *plan,
                          char *err, uint64_t err_cap);
int32_t waste_open(const char *path, const waste_cfg *cfg, waste_ctx **out,
                   char *err, uint64_t err_cap);
void waste_close(waste_ctx *ctx);

int32_t waste_get_model_info(waste_ctx *ctx, waste_model_info *info);

/* Plain: specials are never recognised; every id < n_base_vocab. */
int32_t waste_tokenize(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos,
                       int32_t *out, uint64_t cap, uint64_t *n_out);
/* Markup: specials recognised anywhere, longest match first. */
int32_t waste_tokenize_markup(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos,
                              int32_t *out, uint64_t cap, uint64_t *n_out);
/* Raw bytes (not NUL-terminated), specials written as their text. */
int32_t waste_detokenize(waste_ctx *ctx, const int32_t *ids, uint64_t n,
                         char *out, uint64_t cap, uint64_t *n_out);

int32_t waste_generate(waste_ctx *ctx, const int32_t *prompt, uint64_t n,
                       const waste_gen_params *params, waste_token_cb cb, void *user,
                       waste_gen_result *res);
/* Appends n >= 1 tokens; copies the last position's logits when logits != NULL
 * (cap >= vocab floats, else E_SPACE before any work). */
int32_t waste_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n, float *logits, uint64_t cap);
int32_t waste_reset(waste_ctx *ctx);
uint64_t waste_position(waste_ctx *ctx);

int32_t waste_get_stats(waste_ctx *ctx, waste_stats *stats);

int32_t waste_snapshot_size(waste_ctx *ctx, uint64_t *size);
int32_t waste_snapshot_save(waste_ctx *ctx, void *buf, uint64_t cap, uint64_t *n_out);
int32_t waste_snapshot_load(waste_ctx *ctx, const void *buf, uint64_t len);

/* Writes the access counts (those merged from the hotlist at open plus this ctx's: one per
 * token, layer and routed expert in decode, one per distinct expert per prefill chunk and
 * layer) to `path` in docs/FORMAT.md §8 layout, via a temporary file in the same directory
 * renamed over it. path NULL = cfg.usage_path (its container default when that was NULL);
 * when cfg.usage_path was "" a NULL path writes nothing and returns OK. An empty path is
 * E_ARG; a failure to write or rename is E_IO, the detail naming the file. Saving twice
 * writes the same merged counts (the file is not re-read). */
int32_t waste_save_usage(waste_ctx *ctx, const char *path);

void waste_abort(waste_ctx *ctx);
const char *waste_last_error(waste_ctx *ctx);

/* Vision: E_UNSUPPORTED until the vision tower lands. rgb: w*h*3 bytes. */
int32_t waste_image_add(waste_ctx *ctx, const void *rgb, uint32_t w, uint32_t h, uint32_t *n_pos);
int32_t waste_image_expand(waste_ctx *ctx, const int32_t *in, uint64_t n,
                           int32_t *out, uint64_t cap, uint64_t *n_out);
int32_t waste_image_clear(waste_ctx *ctx);

/* WASTE_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* WASTE_H */
