/* internal.h — what libwaste's base layer offers (not public): util (crc, fp16, errors,
 * clocks), numerics (exp, log), json (bounded parser), weight formats, kernels (dot
 * products + dispatch), pool (fork-join threads), container (manifest, trunk, banks,
 * records). None of them knows waste_ctx. The layers above have their own headers
 * (engine.h, context.h, sysinfo.h, open.h, session.h, snapshot.h); native/README.md
 * draws who may call whom.
 */
#ifndef WASTE_INTERNAL_H
#define WASTE_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "waste.h"

#define WASTE_VERSION_STRING "0.1.0"
#define WASTE_FORMAT_VERSION 1
#define WASTE_ERR_CAP 1024

#define WASTE_API __attribute__((visibility("default")))

/* ---- util.c --------------------------------------------------------------------- */
uint32_t wu_crc32(const void *data, uint64_t len);
uint32_t wu_crc32_update(uint32_t crc, const void *data, uint64_t len); /* crc = running ~ */
uint64_t wu_fnv1a64(const void *data, uint64_t len);
float wu_fp16_to_f32(uint16_t h);
float wu_bf16_to_f32(uint16_t b);
double wu_now_ms(void);
/* Formats into err (cap bytes, always NUL-terminated when cap > 0). */
void wu_errf(char *err, uint64_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* vsnprintf in the C numeric locale, then wu_sanitize (every detail goes through it). */
void wu_vformat(char *err, uint64_t cap, const char *fmt, va_list ap);
/* Rewrites err in place so it is valid UTF-8: each byte that does not start a valid
 * sequence (a path's, a truncation's) becomes the text \xNN. wu_errf and wx_err call it. */
void wu_sanitize(char *err, uint64_t cap);
/* Overflow-checked u64 arithmetic: return 0 on overflow. */
int wu_mul(uint64_t a, uint64_t b, uint64_t *out);
int wu_add(uint64_t a, uint64_t b, uint64_t *out);
/* Opens path O_RDONLY | O_CLOEXEC | extra_flags without blocking on a FIFO and keeps it
 * only if it is a regular file (O_NONBLOCK cleared again); *size = its size. 0 on success,
 * -1 open/fstat failed (errno set), -2 not a regular file. */
int wu_open_regular(const char *path, int extra_flags, int *fd_out, uint64_t *size);
/* Reads exactly len bytes at off, looping on EINTR and short reads; -1 error, -2 EOF. */
int wu_pread_full(int fd, void *buf, uint64_t len, uint64_t off);
uint64_t wu_read_u64le(const uint8_t *p);
uint32_t wu_read_u32le(const uint8_t *p);
void wu_write_u64le(uint8_t *p, uint64_t v);
void wu_write_u32le(uint8_t *p, uint32_t v);
void *wu_aligned_alloc(uint64_t align, uint64_t size); /* zeroed; free with free() */
/* Zeroed, 2 MiB-aligned and advised for transparent huge pages (madvise, before the pages are
 * touched); free with free(). For the expert slots: a record read into huge pages pins a few
 * pages instead of hundreds (O_DIRECT), and the matvecs walk fewer TLB entries. */
void *wu_huge_alloc(uint64_t size);

/* ---- numerics.c: the engine's own transcendentals (docs/ENGINE.md §4.3) ---------- */
double wn_exp(double x);
double wn_log(double x);
float wn_expf(float x);   /* (float)wn_exp(x) */
float wn_logf(float x);
float wn_tanhf(float x);  /* SiTU's tanh, in double rounded once */

/* ---- json.c: a small bounded DOM parser for untrusted manifests ----------------- */
typedef enum { WJ_NULL = 0, WJ_BOOL, WJ_NUM, WJ_STR, WJ_ARR, WJ_OBJ } wj_type;
typedef struct wj_val wj_val;
struct wj_val {
    wj_type type;
    double num;          /* WJ_NUM, WJ_BOOL (0/1) */
    int is_int;          /* number had no fraction/exponent and fits int64 */
    int64_t i;           /* WJ_NUM when is_int */
    const char *str;     /* WJ_STR (NUL-terminated, unescaped); key for members */
    uint32_t str_len;
    const char *key;     /* set on object members */
    wj_val *child;       /* first child (arrays, objects) */
    wj_val *next;        /* next sibling */
    uint32_t n_children;
};
typedef struct wj_doc wj_doc;
/* Parses text (len bytes); limits: depth <= 16, strings <= 4096 bytes, <= 2^20 values. */
int32_t wj_parse(const char *text, uint64_t len, wj_doc **out, char *err, uint64_t cap);
const wj_val *wj_root(const wj_doc *d);
void wj_free(wj_doc *d);
const wj_val *wj_get(const wj_val *obj, const char *key);
const wj_val *wj_at(const wj_val *arr, uint32_t i);

/* ---- weight formats ------------------------------------------------------------- */
enum { WF_F32 = 0, WF_BF16 = 1, WF_INT8 = 2, WF_INT4 = 3, WF_MXFP4 = 4 };
const char *wf_name(int32_t fmt);
int32_t wf_parse(const char *name);                    /* -1 if unknown */
/* Bytes of one row of `cols` values; 0 on a shape the format cannot hold. */
uint64_t wf_row_bytes(int32_t fmt, uint32_t group, uint64_t cols);

/* A matrix view [rows, cols] in one of the formats. */
typedef struct {
    int32_t fmt;
    uint32_t group;
    uint32_t rows, cols;
    uint64_t row_bytes;
    const uint8_t *data;
} wm_mat;

/* ---- kernels.c ------------------------------------------------------------------ */
typedef struct {
    const char *name;
    float (*dot_f32)(const float *w, const float *x, uint32_t n);
    float (*dot_bf16)(const uint16_t *w, const float *x, uint32_t n);
    float (*dot_int8)(const uint8_t *row, const float *x, uint32_t n, uint32_t group);
    float (*dot_int4)(const uint8_t *row, const float *x, uint32_t n, uint32_t group);
    float (*dot_mxfp4)(const uint8_t *row, const float *x, uint32_t n);   /* group 32 */
    /* y[r] = row r · x for r in [r0, r1): each row exactly as dot_* above (several rows
     * interleaved for ILP, never a different order within a row). */
    void (*rows)(const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, float *y);
    /* The same rows against activations quantized by wk_quantize_q8 (WASTE_ACT_Q8; int8,
     * int4 and mxfp4 matrices only): per block b of 32 columns, the weights as 32 int8 w
     * (int8 q, int4 nibble − 8, mxfp4 2·E2M1) with scale sw (fp16 group scale; E8M0 / 2),
     * d = sw · xd[b] (f32), p_j = Σ_{k<4} w[4j+k]·xq[32b+4j+k] exactly in int32, and
     * acc[8·(b mod 2) + j] = fma((float)p_j, d, acc[...]) for j < 8; wk_reduce16 finishes. */
    void (*rows_q8)(const wm_mat *m, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xd, float *y);
    /* One row of a KDA state (docs/ENGINE.md §4.1), elementwise over j < n, each element a
     * product then a sum, never fused, so every set gives the generic bits:
     * decay_read: s[j] = s[j]·e, then r[j] = r[j] + s[j]·k;
     * update_read: s[j] = s[j] + k·delta[j], then o[j] = o[j] + s[j]·q. */
    void (*decay_read)(float *s, float e, float k, float *r, uint32_t n);
    void (*update_read)(float *s, float k, const float *delta, float q, float *o, uint32_t n);
    /* y[j] = y[j] + a·w[j] over an int8 row of n columns (group 32 or 128, fp16 scale s each; w[j] =
     * (float)q[j]·s): the weight, then the product, then the sum, each rounded, never fused,
     * so every set gives the generic bits (MLA's absorbed query, docs/ENGINE.md §4.1 and §4.3). */
    void (*axpy_int8)(const uint8_t *row, float a, float *y, uint32_t n, uint32_t group);
    /* y[i] = wn_expf(x[i]) for i < n, bit for bit (numerics.c's double algorithm, lanes at a
     * time; x and y may alias). */
    void (*exp_f32)(const float *x, float *y, uint32_t n);
    /* y[j] = y[j] + a·x[j] for j < n: the product, then the sum, each rounded, never fused, so
     * every set gives the generic bits (MLA's context, a weighted sum of latents). */
    void (*axpy_f32)(float *y, float a, const float *x, uint32_t n);
    /* wk_quantize_q8 (below), bit for bit: every set's q8 input is the generic's. */
    void (*quantize_q8)(const float *x, uint32_t n, int8_t *xq, float *xd);
} wk_kernels;
/* Activations for WASTE_ACT_Q8, per block b of 32 (n a multiple of 32): a = max |x_i| of the
 * block, xd[b] = a / 127, xq_i = round-half-even(x_i · (127 / a)) (0 when a = 0); a block
 * holding a NaN or an infinity gets xd = NaN, so the rows it meets are NaN as in f32. */
void wk_quantize_q8(const float *x, uint32_t n, int8_t *xq, float *xd);
/* y[r] for r in [r0, r1) through k->rows, or k->rows_q8 when xq is not NULL and the format
 * is int8/int4/mxfp4. */
void wk_matvec_rows(const wk_kernels *k, const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, const int8_t *xq,
                    const float *xd, float *y);
static inline int wk_q8_format(int32_t fmt) { return fmt == WF_INT8 || fmt == WF_INT4 || fmt == WF_MXFP4; }
/* Generic pieces of the q8 path the SIMD files reuse. */
void wk_rows_f32act_generic(const wm_mat *m, uint32_t r0, uint32_t r1, const float *x, float *y);
void wk_exp_f32_generic(const float *x, float *y, uint32_t n);
void wk_axpy_f32_generic(float *y, float a, const float *x, uint32_t n);
void wk_rows_q8_generic(const wm_mat *m, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xd, float *y);
/* The kernel set for cfg.kernels (WASTE_KERNELS_*); NULL when the CPU or the build lacks
 * the named set, *why (when not NULL) then says which feature is missing. */
const wk_kernels *wk_select(int32_t kernels_cfg, const char **why);
const char *wk_built(void);                         /* "generic,avx2,avx512" */
const char *wk_best(void);
float wk_dot_row(const wk_kernels *k, const wm_mat *m, uint32_t row, const float *x);
void wk_decode_row(const wm_mat *m, uint32_t row, float *out);
/* y[j] = y[j] + a·w[j] for row `row` of m decoded as wk_decode_row does it (each weight, then
 * the product, then the sum rounded): int8 by the set's axpy_int8, straight from the row;
 * other formats decoded into scratch [m->cols] first. */
void wk_axpy_row(const wk_kernels *k, const wm_mat *m, uint32_t row, float a, float *y, float *scratch);
/* Generic pieces reused by the SIMD files for tails and the fixed reduction tree. */
float wk_reduce16(float acc[16]);
float wk_dot_f32_generic(const float *w, const float *x, uint32_t n);
void wk_decay_read_generic(float *s, float e, float k, float *r, uint32_t n);
void wk_update_read_generic(float *s, float k, const float *delta, float q, float *o, uint32_t n);
void wk_axpy_int8_generic(const uint8_t *row, float a, float *y, uint32_t n, uint32_t group);
float wk_dot_bf16_generic(const uint16_t *w, const float *x, uint32_t n);
float wk_dot_int8_generic(const uint8_t *row, const float *x, uint32_t n, uint32_t group);
float wk_dot_int4_generic(const uint8_t *row, const float *x, uint32_t n, uint32_t group);
float wk_dot_mxfp4_generic(const uint8_t *row, const float *x, uint32_t n);
/* MXFP4 decoding (docs/FORMAT.md §2): E2M1 value of a nibble; twice it as an integer;
 * the E8M0 scale 2^(e−127) and its half 2^(e−128) (NaN for e = 255). */
float wk_e2m1(uint8_t nibble);
extern const int8_t wk_e2m1x2[16];
float wk_e8m0(uint8_t e);
float wk_e8m0_half(uint8_t e);
/* The first (row, group) of an mxfp4 matrix whose E8M0 scale byte is 255; 0 if none. */
int wk_mxfp4_find_nan_scale(const uint8_t *data, uint32_t rows, uint32_t cols, uint32_t *row, uint32_t *group);
extern const wk_kernels wk_avx2_kernels;
extern const wk_kernels wk_avx512_kernels;
extern const wk_kernels wk_avx512vnni_kernels;

/* ---- pool.c: fork-join workers; the caller is worker 0 -------------------------- */
typedef struct wp_pool wp_pool;
typedef void (*wp_fn)(void *arg, uint32_t begin, uint32_t end);
/* cpus: NULL, or n_threads CPU ids (worker i is pinned to cpus[i]). */
int32_t wp_create(uint32_t n_threads, const int *cpus, wp_pool **out);
void wp_destroy(wp_pool *p);
uint32_t wp_size(const wp_pool *p);
/* Runs fn over [0,n) in contiguous chunks claimed by the workers (the caller is one); returns
 * after all finished. Each item is computed by one worker, so results never depend on which. */
void wp_run(wp_pool *p, uint32_t n, wp_fn fn, void *arg);

/* ---- container.c ---------------------------------------------------------------- */
#define WC_MAX_LAYERS 4096
typedef struct {
    char name[96];
    int32_t fmt;
    uint32_t group;
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t offset, length;
    int on_disk;
    uint8_t *data;          /* resident copy (NULL when on_disk or not loaded) */
} wc_tensor;

typedef struct {
    uint32_t layer;
    char path[1024];
    int fd;
    int direct;             /* opened O_DIRECT and the probe read worked */
    uint32_t n_experts;
    int32_t fmt;
    uint32_t group;
    uint32_t rows[3], cols[3];
    uint64_t record_bytes, body_length;
    uint64_t block_off[3], block_len[3];
} wc_bank;

typedef struct {
    uint32_t hidden, vocab, n_layers, inter, moe_inter;
    uint32_t n_experts, top_k, n_shared, n_group, topk_group;
    int renorm;
    float routed_scale;
    uint8_t is_mla[WC_MAX_LAYERS];
    uint8_t is_moe[WC_MAX_LAYERS];
    uint32_t kda_heads, kda_dim, conv_k;
    uint32_t mla_heads, kv_rank, q_rank, d_nope, d_rope, d_v;
    float rms_eps, mla_eps, l2_eps;
    int32_t bos, eos, pad;
    uint64_t ctx_train;
    uint32_t n_moe, n_mla, n_kda;
    /* Kimi K3 deltas (docs/ENGINE.md §4.2), each from its own config key; 0 = Kimi-Linear. */
    int situ;                   /* hidden_act "situ" */
    float situ_beta, situ_lbeta;
    int has_lbeta;              /* activation_situ_linear_beta set (else u passes unchanged) */
    uint32_t rz;                /* routed_expert_hidden_size: latent MoE width, 0 = none */
    int latent_norm;            /* latent_moe_use_norm */
    uint32_t res_block;         /* attn_res_block_size: attention residuals, 0 = plain */
    int mla_gate;               /* mla_use_output_gate */
    int kda_full_gate;          /* use_full_rank_gate */
    int lower_bound;            /* kda_decay "lower_bound" */
    float gate_lb;              /* gate_lower_bound (lambda < 0) */
} wc_config;

typedef struct {
    char dir[1024];
    char *manifest_text;
    uint64_t manifest_len;
    uint64_t fingerprint;
    wc_config cfg;
    wc_tensor *tensors;
    uint32_t n_tensors;
    uint32_t *by_name;       /* tensor indices sorted by name (wc_find's binary search) */
    wc_bank *banks;          /* one per MoE layer, in layer order */
    uint32_t n_banks;
    int32_t bank_of_layer[WC_MAX_LAYERS]; /* -1 for dense layers */
    int has_tokenizer;
    uint32_t n_base_vocab;
    char ranks_path[1100], specials_path[1100];
    uint64_t trunk_file_size;
    uint64_t resident_bytes; /* sum of non-on_disk tensor lengths */
    uint64_t max_record_bytes, all_expert_bytes;
    int trunk_fd;
    uint8_t *trunk_mem;
    uint64_t probe_bytes;    /* the O_DIRECT probe buffer wc_open_data held briefly (0 if none) */
    char trunk_fmt[16], expert_fmt[16];
    uint32_t expert_group;
    char arch[32];           /* manifest arch: "kimi_linear" or "kimi_k3" */
} wc_container;

/* Parses and validates manifest.json (no bank I/O). */
int32_t wc_open_manifest(const char *dir, wc_container *c, char *err, uint64_t cap);
/* Opens the banks (size check, O_DIRECT probe) and loads the resident trunk. */
int32_t wc_open_data(wc_container *c, int direct_io, int verify, char *io_note, uint64_t note_cap,
                     char *err, uint64_t cap);
void wc_close(wc_container *c);
const wc_tensor *wc_find(const wc_container *c, const char *name);
/* Reads expert e of bank b into buf (record_bytes, 4096-aligned) and validates it. */
int32_t wc_read_record(const wc_container *c, const wc_bank *b, uint32_t expert, uint8_t *buf,
                       int verify, char *err, uint64_t cap);
/* Reads one embedding row (decoded to f32). */
int32_t wc_read_embed_row(const wc_container *c, const wc_tensor *t, uint32_t row, uint8_t *tmp,
                          float *out, char *err, uint64_t cap);

#endif
