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
 * E_IO, E_FORMAT, E_NOMEM or E_BUDGET (no evictable expert slot) during eval/generate
 * poison the ctx: eval, generate, snapshot_save and snapshot_load then return E_STATE
 * until waste_reset. Other failures leave the ctx unchanged. Every failing call sets a
 * non-empty detail.
 *
 * Threads. A ctx is not thread-safe; an atomic in-call flag turns concurrent or
 * re-entrant use into E_BUSY (and waste_close during a call into a no-op). waste_abort,
 * waste_get_stats and waste_get_model_info may be called from any thread at any time
 * (inside the token callback only abort and get_stats are allowed). Contexts share
 * nothing.
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

#define WASTE_API_VERSION 6
#define WASTE_MAX_TOP_LOGPROBS 20   /* waste_gen_params.n_top_logprobs at most */

/* Status codes (docs/ENGINE.md §1). */
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

/* Expert-cache eviction (docs/ENGINE.md §5 Policy). The policy changes which reads happen,
 * never a logit. */
typedef enum {
    WASTE_CACHE_LFRU = 0,      /* 16 sampled slots: fewest hits since loaded, then oldest */
    WASTE_CACHE_LRU = 1,       /* 16 sampled slots: oldest */
    WASTE_CACHE_LAYER = 2      /* every slot: furthest next use in the layer cycle, then fewest
                                * accesses since open, then oldest, unless an expert of any layer
                                * has clearly fewer accesses (2 sd of a count); never an expert the
                                * current layer still needs. Scan-resistant below one token's
                                * working set */
} waste_cache_policy;

/* Kernel sets (cfg.kernels). All give bit-identical logits (docs/ENGINE.md §4.3); a named SIMD
 * set the CPU lacks (or this build has not) is E_UNSUPPORTED at plan/open, naming it. */
typedef enum {
    WASTE_KERNELS_AUTO = 0,    /* best of avx512 / avx2 / generic detected at runtime */
    WASTE_KERNELS_GENERIC = 1, /* portable C */
    WASTE_KERNELS_AVX2 = 2,    /* needs AVX2 and FMA */
    WASTE_KERNELS_AVX512 = 3   /* needs AVX-512F */
} waste_kernels;

/* Activations of the int8/int4/mxfp4 matrix-vector products (cfg.activations; docs/ENGINE.md
 * §4.3). F32 is the reference: every weight is decoded to f32 and multiplied by the f32
 * activation. Q8 quantizes each activation vector once per product in blocks of 32 (scale =
 * max |x| / 127, round half to even) and sums int8 x int8 products exactly in integers, then
 * scales each block in f32 in a fixed order: faster (VNNI / AVX2 integer dot products), logits
 * within the error docs/ENGINE.md §4.3 states of the F32 path, and bit-identical across the
 * kernel sets. f32 and bf16 matrices always use f32 activations. */
typedef enum {
    WASTE_ACT_F32 = 0,         /* exact f32 activations (the reference) */
    WASTE_ACT_Q8 = 1           /* activations as int8 per block of 32 for quantized weights */
} waste_activations;

typedef struct waste_ctx waste_ctx;

/* Open-time options. waste_cfg_init fills the defaults shown in brackets. */
typedef struct {
    uint32_t struct_size;
    uint32_t ctx_tokens;        /* [0 -> 4096] maximum position */
    uint64_t ram_budget_bytes;  /* [0 = auto, docs/ENGINE.md §5] */
    uint32_t n_threads;         /* [0 = one per allowed CPU] */
    int32_t cache_policy;       /* [WASTE_CACHE_LAYER] a waste_cache_policy */
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
    uint32_t io_threads;        /* [0 = reads on the computing thread] 1..64 reader threads:
                                 * a layer's misses (up to top_k) are queued at once and each
                                 * expert is computed when its record has landed, in ascending
                                 * id as always (docs/ENGINE.md §5): logits never change.
                                 * Reads start in the order their layers need them */
    uint32_t lookahead;         /* [0] 1 = decode router lookahead: the next MoE layer's router
                                 * on this layer's FFN input guesses its experts and queues
                                 * speculative reads of its top ranks into evictable slots,
                                 * and before each MoE layer's mixer its own router guesses
                                 * again and reads the rest; guesses the real router does not
                                 * select and no reader has started are taken back (logits
                                 * never change). Needs io_threads >= 1; values above 1 are
                                 * E_ARG */
    int32_t tokenizer_only;     /* [0] load the tokenizer and manifest only */
    int32_t kernels;            /* [WASTE_KERNELS_AUTO] a waste_kernels value */
    /* API version 6 */
    int32_t activations;        /* [WASTE_ACT_F32] a waste_activations value; other values are
                                 * E_ARG. Logits differ between the two (never between
                                 * kernel sets, policies, readers or budgets) */
    uint32_t reserved0;
} waste_cfg;

/* Memory plan (docs/ENGINE.md §5): what open would allocate, from the manifest alone. */
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
    char arch[32];              /* the manifest's arch: "kimi_linear" or "kimi_k3" (the K3
                                 * deltas follow their config keys, not this name) */
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

/* The allowed-token mask (constrained decoding). Called by waste_generate before each
 * token is sampled, with index = the 0-based index of the token about to be sampled and
 * allowed[0..n_words) = ceil(vocab / 32) words, every bit of an id < vocab set (bit j % 32
 * of word j / 32 is id j). Clear the bits of the ids that must not be sampled and return
 * 0: their logits become -inf after bias and penalties, so they are neither drawn nor
 * counted in the reported logprobs. A mask that leaves no id allowed is E_ARG ("the mask
 * allows no token"); a non-zero return stops generation before the token (stop_reason
 * CALLBACK, nothing delivered). Same calling rules as waste_token_cb. */
typedef int32_t (*waste_mask_cb)(uint32_t index, uint32_t *allowed, uint32_t n_words, void *user);

typedef struct {
    uint32_t struct_size;
    float temperature;          /* [0.0] 0 = greedy (argmax, ties to the lower id) */
    float top_p;                /* [1.0] */
    uint32_t top_k;             /* [0 = off] */
    uint64_t seed;              /* [0] xoshiro256** seeded by splitmix64(seed) per call */
    uint32_t max_tokens;        /* [0 = until a stop id or the context is full] */
    uint32_t n_stop_ids;        /* [0] */
    const int32_t *stop_ids;    /* [NULL] read during the call only */
    /* Logit processing (docs/ENGINE.md §2 Logit processing), in this order on the last
     * logits l before each token: logit bias, penalties, the mask. All off by default: with
     * the defaults below the logits are not touched (byte-identical draws and logprobs). */
    uint32_t n_logit_bias;      /* [0] l[logit_bias_ids[i]] += logit_bias[i] (OpenAI) */
    uint32_t n_top_logprobs;    /* [0] 0..20: the most likely ids reported per token */
    const int32_t *logit_bias_ids;  /* [NULL] each < vocab; read during the call only */
    const float *logit_bias;        /* [NULL] finite */
    float presence_penalty;     /* [0] OpenAI: l[j] -= presence_penalty * (c[j] > 0) */
    float frequency_penalty;    /* [0] OpenAI: l[j] -= frequency_penalty * c[j]; c[j] = times
                                 * j was generated by this call (prompt not counted) */
    float repetition_penalty;   /* [1 = off] vLLM: for j in the context (every evaluated id
                                 * since the reset, prompt included) or generated by this call,
                                 * l[j] = l[j] > 0 ? l[j] / r : l[j] * r; r > 0 */
    float min_p;                /* [0 = off] vLLM: after temperature, keep the ids whose
                                 * probability is >= min_p * the largest; in [0, 1] */
    waste_mask_cb mask_cb;      /* [NULL] called before each token: see waste_mask_cb */
    void *mask_user;            /* [NULL] passed to mask_cb */
} waste_gen_params;

/* Passed to the token callback; valid only during the callback. */
typedef struct {
    uint32_t struct_size;
    uint32_t index;             /* 0-based index of the generated token */
    int32_t token;
    int32_t is_stop;
    float logprob;              /* log-softmax at `token` of the logits after bias, penalties
                                 * and mask, before temperature (the raw logits by default) */
    uint32_t experts_hit;       /* for the pass that produced this token */
    uint32_t experts_missed;    /* (index 0 includes the prefill) */
    uint32_t piece_len;
    uint64_t bytes_read;
    double ms;
    double io_ms;
    const char *piece;          /* UTF-8; an incomplete tail is held for a later piece */
                                /* empty for an id with no text (vocab padding) */
    uint32_t n_top;             /* = params.n_top_logprobs (fewer when the vocab is smaller) */
    uint32_t reserved1;
    const int32_t *top_ids;     /* [n_top] the most likely ids, descending, ties to the lower */
    const float *top_logprobs;  /* [n_top] their logprobs (as `logprob`) */
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
    uint32_t tail_len;          /* bytes in tail (0..3) */
    char tail[4];               /* UTF-8 bytes still held back when generation ended without
                                 * a final flush (callback stop, abort, an error after the
                                 * first token): pieces + tail == detokenize(delivered ids) */
    /* API version 6: this call's share of the waste_stats lookahead counters. */
    uint64_t guesses;           /* speculative reads issued by lookahead during the call */
    uint64_t guess_hits;        /* of those, guesses the real router then selected */
    uint64_t wasted_bytes;      /* guess bytes found unused during the call (each forward
                                 * pass settles its own guesses before it returns) */
} waste_gen_result;

/* Cumulative since open; filled from atomics, callable from any thread. */
typedef struct {
    uint32_t struct_size;
    int32_t direct_io;          /* 1 only if every bank bypasses the page cache */
    uint64_t tokens;            /* tokens evaluated */
    uint64_t hits;              /* expert accesses served from a slot */
    uint64_t misses;            /* expert accesses that read a record */
    uint64_t reads;             /* record reads issued: misses + lookahead guesses */
    uint64_t bytes_read;        /* by misses and guesses (warming is counted in warm_bytes only) */
    uint64_t warm_bytes;        /* records read at open to warm the slots from the hotlist */
    double compute_s;
    double io_s;                /* the sum of every read's duration (overlapping reads add up;
                                 * see disk_busy_s) */
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
    char usage_note[160];       /* why the hotlist was ignored or entries skipped, or the first
                                 * damaged record warming skipped ("not warmed: ..."; the
                                 * call that needs it fails naming it); empty when it was
                                 * read and warmed cleanly, absent, or usage_path is "" */
    /* API version 4: reading ahead (cfg.io_threads, cfg.lookahead). */
    uint32_t io_threads;        /* reader threads running (cfg.io_threads) */
    uint32_t lookahead;         /* cfg.lookahead */
    uint64_t guesses;           /* speculative reads issued by lookahead (one taken back
                                 * before a reader started it is not counted) */
    uint64_t guess_hits;        /* guesses the real router then selected (accuracy =
                                 * guess_hits / guesses); each is also counted as a miss */
    uint64_t wasted_bytes;      /* bytes of guesses never selected by the token they were
                                 * read for (the record stays cached) */
    uint64_t queue_depth_max;   /* most reads queued or in flight at once in the reader pool */
    double disk_busy_s;         /* time at least one read was in flight in the reader pool
                                 * (with io_threads 0: io_s, the reads being serial) */
    double io_wait_s;           /* time the computing thread waited for a record */
    /* API version 6 */
    int32_t activations;        /* cfg.activations (waste_activations) */
    uint32_t reserved1;
} waste_stats;

/* ---- static calls: safe from any thread, no ctx ------------------------------------ */
const char *waste_version(void);            /* "0.1.0"; static storage */
uint32_t waste_api_version(void);           /* WASTE_API_VERSION of the built library */
/* The compiler, the kernel sets built and the one AUTO selects (generic/avx2/avx512),
 * format_version and O_DIRECT support; static storage. */
const char *waste_build_info(void);
const char *waste_status_name(int32_t status);   /* "E_IO", ...; "E_UNKNOWN" otherwise */
/* min(physical RAM, the cgroup memory.max / memory.high limits up the cgroup path). */
uint64_t waste_usable_ram(void);

/* Fill defaults and struct_size; NULL-safe. Call before setting fields. */
void waste_cfg_init(waste_cfg *cfg);
void waste_plan_init(waste_plan *plan);
void waste_model_info_init(waste_model_info *info);
void waste_gen_params_init(waste_gen_params *params);
void waste_gen_result_init(waste_gen_result *res);
void waste_stats_init(waste_stats *stats);

/* ---- plan and open ------------------------------------------------------------------- */
/* Fills *plan from the manifest alone (no data file is read, nothing stays allocated),
 * with the sizing code open uses. cfg NULL = defaults. The detail goes to err/err_cap.
 *   E_ARG          path or plan NULL, a struct_size mismatch, a cfg field out of range
 *   E_UNSUPPORTED  an unimplemented cfg option, a kernel set this CPU lacks, an unknown
 *                  arch, activation or KDA decay form
 *   E_IO           manifest.json missing, unreadable or not a regular file
 *   E_FORMAT       the manifest breaks docs/FORMAT.md §3 (the detail names the field or
 *                  tensor), or the memory sizing overflows u64
 *   E_BUDGET       an explicit budget below the floor or above usable RAM, or a floor
 *                  above usable RAM
 *   E_NOMEM */
int32_t waste_plan_memory(const char *path, const waste_cfg *cfg, waste_plan *plan,
                          char *err, uint64_t err_cap);
/* Validates the container (docs/FORMAT.md), resolves the budget, loads the trunk and the
 * tokenizer, opens the banks (probing O_DIRECT), allocates state and expert slots and
 * warms them from the hotlist. *out is the new ctx, or NULL on failure (nothing leaks).
 * Statuses as waste_plan_memory, plus E_IO (a data file missing, short, unreadable or not
 * a regular file), E_FORMAT (bank header, tokenizer file, size limit), E_BUSY
 * (cfg.exclusive_open and the directory is locked). A bad hotlist never fails open. */
int32_t waste_open(const char *path, const waste_cfg *cfg, waste_ctx **out,
                   char *err, uint64_t err_cap);
/* Frees the ctx: joins its threads before closing its files. NULL-safe. A close while a
 * call is running on ctx (from the token callback, or from another thread) does nothing:
 * close it again once that call has returned. */
void waste_close(waste_ctx *ctx);

/* Any thread, any time. E_ARG: ctx or info NULL, or a struct_size mismatch. */
int32_t waste_get_model_info(waste_ctx *ctx, waste_model_info *info);

/* ---- tokenizer ------------------------------------------------------------------------ */
/* Plain tokenization, for text the host did not write: special texts are never
 * recognised, so every id is < n_base_vocab. add_bos prepends bos_id. Writes up to cap ids
 * to out and sets *n_out to the number produced (also on E_SPACE: the capacity needed).
 *   E_ARG          NULL text (with len > 0), out (with cap > 0) or n_out; add_bos without
 *                  a bos_token_id; text that is not valid UTF-8 ("invalid UTF-8 at byte N":
 *                  truncated or overlong sequences, surrogates, > U+10FFFF; nothing written)
 *   E_SPACE        cap too small; *n_out = ids needed
 *   E_UNSUPPORTED  the container has no tokenizer files
 *   E_BUSY         another call is running on ctx */
int32_t waste_tokenize(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos,
                       int32_t *out, uint64_t cap, uint64_t *n_out);
/* Markup tokenization, for text the host wrote: specials are recognised anywhere, the
 * longest match first, and the text between them is tokenized as plain. Statuses as
 * waste_tokenize. */
int32_t waste_tokenize_markup(waste_ctx *ctx, const char *text, uint64_t len, int32_t add_bos,
                              int32_t *out, uint64_t cap, uint64_t *n_out);
/* The raw bytes of ids (not NUL-terminated, not necessarily valid UTF-8 on their own),
 * specials written as their text. *n_out = bytes produced (on E_SPACE: bytes needed).
 *   E_ARG          NULL ids (with n > 0), out (with cap > 0) or n_out; an id with no text
 *                  (the detail names its index)
 *   E_SPACE, E_UNSUPPORTED, E_BUSY as waste_tokenize */
int32_t waste_detokenize(waste_ctx *ctx, const int32_t *ids, uint64_t n,
                         char *out, uint64_t cap, uint64_t *n_out);

/* ---- evaluation ----------------------------------------------------------------------- */
/* Prefills prompt[0..n) then samples, delivers and evaluates tokens (docs/ENGINE.md §2).
 *
 * Checked in this order before any work: res and params struct_size, params (finite
 * temperature >= 0, top_p in (0, 1], stop_ids with n_stop_ids) -> E_ARG; a tokenizer_only
 * ctx -> E_UNSUPPORTED; a poisoned ctx -> E_STATE; n >= 1 and every id < vocab -> E_ARG;
 * position + n <= ctx_tokens -> E_CTX (nothing evaluated).
 *
 * The prompt is evaluated in chunks of cfg.prefill_chunk; then, per token: sample from the
 * last logits (waste_gen_params), call cb (when not NULL) with the token, its logprob and
 * its UTF-8 piece, and stop — on a stop id (stop_reason TOKEN, the stop token delivered),
 * when cb returned non-zero (CALLBACK), after max_tokens deliveries (MAX_TOKENS), or when
 * the next evaluation would not fit ctx_tokens (CTX_FULL) — or else evaluate the token and
 * continue. The last sampled token is never evaluated: afterwards the position is the
 * prompt end + tokens_generated - 1, and a host that continues passes that token back as
 * the first of its next prompt.
 *
 * Callback rules: it runs on the calling thread between tokens; inside it only waste_abort
 * and waste_get_stats may be called (any other call on ctx returns E_BUSY, waste_close does
 * nothing); info and info->piece are valid only during the callback. Pieces hold back an
 * incomplete UTF-8 tail (a piece may be empty); a stop id, max_tokens, CTX_FULL or a
 * special flushes it, so the pieces of a run that ends that way concatenate to
 * detokenize(ids); otherwise the held bytes are in res->tail.
 *
 * An abort (waste_abort) is honoured before each prefill chunk and after each delivered
 * token: E_CANCELLED, everything evaluated so far stays (a consistent state), the flag is
 * cleared. E_IO / E_FORMAT / E_NOMEM / E_BUDGET poison the ctx (waste_reset clears it).
 * res (may be NULL) is written on every return after the argument checks, errors included.
 * Returns OK when generation stopped for one of the four stop reasons. */
int32_t waste_generate(waste_ctx *ctx, const int32_t *prompt, uint64_t n,
                       const waste_gen_params *params, waste_token_cb cb, void *user,
                       waste_gen_result *res);
/* Appends ids[0..n) at the current position (for hosts that sample themselves) and copies
 * the last position's logits when logits != NULL (cap >= vocab floats, else E_SPACE before
 * any work). The same checks as waste_generate (E_UNSUPPORTED, E_STATE, E_ARG, E_CTX)
 * come first; an abort is honoured before each chunk (E_CANCELLED, the chunks already
 * evaluated stay); E_IO / E_FORMAT / E_NOMEM / E_BUDGET poison the ctx. */
int32_t waste_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n, float *logits, uint64_t cap);
/* Back to position 0: KDA state and conv rings zeroed, MLA latents dropped, the image
 * queue, the abort flag and the poison cleared. The expert cache and counts are kept.
 * E_ARG (NULL ctx) or E_BUSY only. */
int32_t waste_reset(waste_ctx *ctx);
/* Tokens evaluated since the last reset (or restored by a snapshot); 0 for NULL. */
uint64_t waste_position(waste_ctx *ctx);

/* Any thread, any time (atomics). E_ARG: ctx or stats NULL, or a struct_size mismatch. */
int32_t waste_get_stats(waste_ctx *ctx, waste_stats *stats);

/* ---- snapshots (docs/FORMAT.md §7) ---------------------------------------------------- */
/* A snapshot is the exact state at the current position: manifest fingerprint, position,
 * ids, every layer's conv rings, S and MLA latents. It carries no logits: after a restore,
 * evaluate at least one token (eval or generate) before sampling. Restore + eval(suffix)
 * gives logits byte-identical to a fresh prefill of prefix + suffix. */
/* *size = the bytes waste_snapshot_save needs now. E_ARG (NULL size), E_UNSUPPORTED
 * (tokenizer_only), E_BUSY. */
int32_t waste_snapshot_size(waste_ctx *ctx, uint64_t *size);
/* Writes the snapshot to buf; *n_out = its size (on E_SPACE: the size needed).
 * E_ARG (NULL n_out, or NULL buf with cap > 0), E_UNSUPPORTED, E_STATE (poisoned), E_SPACE,
 * E_BUSY. */
int32_t waste_snapshot_save(waste_ctx *ctx, void *buf, uint64_t cap, uint64_t *n_out);
/* Restores a snapshot. Everything is validated before the ctx is touched: a bad magic or
 * version, another model (fingerprint, layer count), a position above ctx_tokens, a wrong
 * length, a crc mismatch or an id outside the vocabulary is E_FORMAT and leaves the ctx
 * untouched. E_STATE on a poisoned ctx (waste_reset first); E_ARG (NULL buf),
 * E_UNSUPPORTED (tokenizer_only), E_BUSY. */
int32_t waste_snapshot_load(waste_ctx *ctx, const void *buf, uint64_t len);

/* Snapshot segments (docs/FORMAT.md §7.1): snapshots of one conversation that share their
 * MLA latents. A segment holds the ids and MLA latents of positions [base, P) only, the
 * whole KDA state at P, and the crc of its parent: the segment that ends at base (none for
 * a root, base 0). A chain root..leaf restores the state at the leaf's P, byte for byte
 * the one a whole snapshot at P restores.
 * The ctx's anchor is the last segment it saved or chain-loaded: eval and generate only
 * append, so the anchor stays the parent of the next segment; waste_reset and
 * waste_snapshot_load clear it (the next segment is then a root). The library keeps no
 * pointer to a segment: the caller owns them, and a chain whose parent it dropped can only
 * be continued by a `whole` (root) segment. */
/* *size = the bytes waste_snapshot_segment_save(ctx, whole, ...) needs now and *base = the
 * segment's first position: the anchor's P, or 0 when `whole` is nonzero or there is no
 * anchor. E_ARG (NULL size or base), E_UNSUPPORTED (tokenizer_only), E_BUSY. */
int32_t waste_snapshot_segment_size(waste_ctx *ctx, int32_t whole, uint64_t *size, uint64_t *base);
/* Writes the segment from the anchor (a root when `whole` or unanchored) to buf and makes it
 * the anchor; *n_out = its size (on E_SPACE: the size needed; the anchor is unchanged).
 * E_ARG (NULL n_out, or NULL buf with cap > 0), E_UNSUPPORTED, E_STATE (poisoned), E_SPACE,
 * E_BUSY. */
int32_t waste_snapshot_segment_save(waste_ctx *ctx, int32_t whole, void *buf, uint64_t cap,
                                    uint64_t *n_out);
/* Restores the chain segments[0..n), root first; lens[i] is segment i's size. Everything is
 * validated before the ctx is touched, as waste_snapshot_load does for each segment, plus
 * the links: segment 0 is a root, segment i starts where i-1 ends and names i-1's crc. Any
 * mismatch is E_FORMAT naming the segment, the ctx untouched. The leaf becomes the anchor.
 * E_ARG (NULL segments or lens, a NULL segment, n = 0), E_STATE (poisoned), E_UNSUPPORTED,
 * E_BUSY. */
int32_t waste_snapshot_chain_load(waste_ctx *ctx, const void *const *segments,
                                  const uint64_t *lens, uint32_t n);

/* Writes the access counts (those merged from the hotlist at open plus this ctx's: one per
 * token, layer and routed expert in decode, one per distinct expert per prefill chunk and
 * layer) to `path` in docs/FORMAT.md §8 layout, via a temporary file in the same directory
 * renamed over it. path NULL = cfg.usage_path (its container default when that was NULL);
 * when cfg.usage_path was "" a NULL path writes nothing and returns OK. An empty path is
 * E_ARG; a failure to write or rename is E_IO, the detail naming the file. Saving twice
 * writes the same merged counts (the file is not re-read). */
int32_t waste_save_usage(waste_ctx *ctx, const char *path);

/* Any thread, any time; NULL-safe. Sets a sticky flag that the running (or next) eval or
 * generate honours at its next token or prefill-chunk boundary with E_CANCELLED, clearing
 * it; waste_reset clears it too. */
void waste_abort(waste_ctx *ctx);
/* The detail of the last failing call on ctx: never NULL, valid until the next call on
 * ctx. While a call is running it is a fixed "E_BUSY: ..." text; for NULL, "ctx is NULL". */
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
