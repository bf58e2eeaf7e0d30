/* container.c — reads a model.waste/ directory (docs/FORMAT.md).
 *
 * The manifest is untrusted: every field is checked for presence, type and range, all
 * size arithmetic is overflow-checked, shape × format must equal the length and
 * offset + length must fit the file. Banks must be exactly header + n records. Records
 * are read with one pread each and validated (magic, version, layer, expert, shapes;
 * crc32 with verify). Every failure names the file, tensor, layer, expert or field.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define MAX_MANIFEST (16u << 20)
#define MAX_DIM (1u << 24)
#define MAX_TENSORS 65536u
#define MAX_EXPERTS 65536u
#define BANK_HEADER 4096u
#define REC_HEADER 256u

/* ==== manifest field helpers ====================================================== */
typedef struct { char *err; uint64_t cap; } ectx;

static int get_u32(const wj_val *obj, const char *key, const char *where, uint64_t max, uint32_t *out,
                   char *err, uint64_t cap) {
    const wj_val *v = wj_get(obj, key);
    if (!v) { wu_errf(err, cap, "manifest.json: missing field %s.%s", where, key); return WASTE_E_FORMAT; }
    if (v->type != WJ_NUM || !v->is_int || v->i < 0 || (uint64_t)v->i > max) {
        wu_errf(err, cap, "manifest.json: field %s.%s must be an integer in [0, %llu]", where, key,
                (unsigned long long)max);
        return WASTE_E_FORMAT;
    }
    *out = (uint32_t)v->i; return WASTE_OK;
}

static int get_u64(const wj_val *obj, const char *key, const char *where, uint64_t *out, char *err, uint64_t cap) {
    const wj_val *v = wj_get(obj, key);
    if (!v) { wu_errf(err, cap, "manifest.json: missing field %s.%s", where, key); return WASTE_E_FORMAT; }
    if (v->type != WJ_NUM || !v->is_int || v->i < 0) {
        wu_errf(err, cap, "manifest.json: field %s.%s must be a non-negative integer", where, key);
        return WASTE_E_FORMAT;
    }
    *out = (uint64_t)v->i; return WASTE_OK;
}

static int get_num(const wj_val *obj, const char *key, const char *where, double lo, double hi, float *out,
                   char *err, uint64_t cap) {
    const wj_val *v = wj_get(obj, key);
    if (!v) { wu_errf(err, cap, "manifest.json: missing field %s.%s", where, key); return WASTE_E_FORMAT; }
    if (v->type != WJ_NUM || !(v->num >= lo && v->num <= hi)) {
        wu_errf(err, cap, "manifest.json: field %s.%s must be a number in [%g, %g]", where, key, lo, hi);
        return WASTE_E_FORMAT;
    }
    *out = (float)v->num; return WASTE_OK;
}

static int get_bool(const wj_val *obj, const char *key, const char *where, int *out, char *err, uint64_t cap) {
    const wj_val *v = wj_get(obj, key);
    if (!v) { wu_errf(err, cap, "manifest.json: missing field %s.%s", where, key); return WASTE_E_FORMAT; }
    if (v->type != WJ_BOOL) { wu_errf(err, cap, "manifest.json: field %s.%s must be a boolean", where, key); return WASTE_E_FORMAT; }
    *out = v->num != 0; return WASTE_OK;
}

static int get_str(const wj_val *obj, const char *key, const char *where, const char **out, char *err, uint64_t cap) {
    const wj_val *v = wj_get(obj, key);
    if (!v) { wu_errf(err, cap, "manifest.json: missing field %s.%s", where, key); return WASTE_E_FORMAT; }
    if (v->type != WJ_STR) { wu_errf(err, cap, "manifest.json: field %s.%s must be a string", where, key); return WASTE_E_FORMAT; }
    *out = v->str; return WASTE_OK;
}

static int get_opt_id(const wj_val *obj, const char *key, int32_t *out, char *err, uint64_t cap) {
    const wj_val *v = wj_get(obj, key);
    *out = -1;
    if (!v || v->type == WJ_NULL) return WASTE_OK;
    if (v->type != WJ_NUM || !v->is_int || v->i < 0 || v->i > INT32_MAX) {
        wu_errf(err, cap, "manifest.json: field config.%s must be a token id or null", key);
        return WASTE_E_FORMAT;
    }
    *out = (int32_t)v->i; return WASTE_OK;
}

#define TRY(x) do { int32_t st_ = (x); if (st_ != WASTE_OK) return st_; } while (0)

/* Optional keys: absent or null leaves *out at its default. */
static int opt_present(const wj_val *obj, const char *key) {
    const wj_val *v = wj_get(obj, key);
    return v && v->type != WJ_NULL;
}

/* The K3 deltas (docs/ENGINE.md §4.2): each from its own key, any subset; every key absent (or
 * null/false/0) is the Kimi-Linear behaviour. Combinations that cannot mean anything are
 * refused naming both keys. */
static int32_t parse_k3(const wj_val *cf, wc_config *c, const char *act, char *err, uint64_t cap) {
    const char *W = "config";
    c->situ = !strcmp(act, "situ");
    if (c->situ) {
        TRY(get_num(cf, "activation_situ_beta", W, 1e-6, 1e6, &c->situ_beta, err, cap));
        if (opt_present(cf, "activation_situ_linear_beta")) {
            TRY(get_num(cf, "activation_situ_linear_beta", W, 1e-6, 1e6, &c->situ_lbeta, err, cap));
            c->has_lbeta = 1;
        }
    } else {
        static const char *situ_keys[] = {"activation_situ_beta", "activation_situ_linear_beta", NULL};
        for (int i = 0; situ_keys[i]; i++)
            if (opt_present(cf, situ_keys[i])) {
                wu_errf(err, cap, "manifest.json: config.%s is set but config.hidden_act is \"%s\" (it needs \"situ\")",
                        situ_keys[i], act);
                return WASTE_E_FORMAT;
            }
    }
    if (opt_present(cf, "routed_expert_hidden_size"))
        TRY(get_u32(cf, "routed_expert_hidden_size", W, MAX_DIM, &c->rz, err, cap));
    if (opt_present(cf, "latent_moe_use_norm")) TRY(get_bool(cf, "latent_moe_use_norm", W, &c->latent_norm, err, cap));
    if (c->latent_norm && !c->rz) {
        wu_errf(err, cap, "manifest.json: config.latent_moe_use_norm is true but config.routed_expert_hidden_size is 0 "
                "(no latent MoE to normalise)");
        return WASTE_E_FORMAT;
    }
    if (opt_present(cf, "attn_res_block_size"))
        TRY(get_u32(cf, "attn_res_block_size", W, WC_MAX_LAYERS, &c->res_block, err, cap));
    if (opt_present(cf, "mla_use_output_gate")) TRY(get_bool(cf, "mla_use_output_gate", W, &c->mla_gate, err, cap));
    if (opt_present(cf, "use_full_rank_gate")) TRY(get_bool(cf, "use_full_rank_gate", W, &c->kda_full_gate, err, cap));
    const char *decay = "softplus";
    if (opt_present(cf, "kda_decay")) TRY(get_str(cf, "kda_decay", W, &decay, err, cap));
    if (strcmp(decay, "softplus") && strcmp(decay, "lower_bound")) {
        wu_errf(err, cap, "manifest.json: config.kda_decay \"%s\" is not supported (\"softplus\" or \"lower_bound\")", decay);
        return WASTE_E_UNSUPPORTED;
    }
    c->lower_bound = !strcmp(decay, "lower_bound");
    if (c->lower_bound) {
        TRY(get_num(cf, "gate_lower_bound", W, -1e6, -1e-30, &c->gate_lb, err, cap));
    } else if (opt_present(cf, "gate_lower_bound")) {
        wu_errf(err, cap, "manifest.json: config.gate_lower_bound is set but config.kda_decay is \"softplus\" "
                "(the bound belongs to \"lower_bound\")");
        return WASTE_E_FORMAT;
    }
    return WASTE_OK;
}

/* ==== config ======================================================================= */
static int32_t parse_config(const wj_val *cf, wc_config *c, char *err, uint64_t cap) {
    const char *W = "config";
    if (!cf || cf->type != WJ_OBJ) { wu_errf(err, cap, "manifest.json: missing field config"); return WASTE_E_FORMAT; }
    const char *act;
    TRY(get_str(cf, "hidden_act", W, &act, err, cap));
    if (strcmp(act, "silu") && strcmp(act, "situ")) {
        wu_errf(err, cap, "manifest.json: config.hidden_act \"%s\" is not supported (\"silu\" or \"situ\")", act);
        return WASTE_E_UNSUPPORTED;
    }
    TRY(get_u32(cf, "hidden_size", W, MAX_DIM, &c->hidden, err, cap));
    TRY(get_u32(cf, "vocab_size", W, MAX_DIM, &c->vocab, err, cap));
    TRY(get_u32(cf, "num_hidden_layers", W, WC_MAX_LAYERS, &c->n_layers, err, cap));
    TRY(get_u32(cf, "intermediate_size", W, MAX_DIM, &c->inter, err, cap));
    TRY(get_u32(cf, "moe_intermediate_size", W, MAX_DIM, &c->moe_inter, err, cap));
    TRY(get_u32(cf, "num_experts", W, MAX_EXPERTS, &c->n_experts, err, cap));
    TRY(get_u32(cf, "num_experts_per_token", W, 1024, &c->top_k, err, cap));
    TRY(get_u32(cf, "num_shared_experts", W, 64, &c->n_shared, err, cap));
    TRY(get_u32(cf, "num_expert_group", W, MAX_EXPERTS, &c->n_group, err, cap));
    TRY(get_u32(cf, "topk_group", W, MAX_EXPERTS, &c->topk_group, err, cap));
    TRY(get_bool(cf, "moe_renormalize", W, &c->renorm, err, cap));
    TRY(get_num(cf, "routed_scaling_factor", W, 0.0, 1e6, &c->routed_scale, err, cap));
    TRY(get_u32(cf, "linear_num_heads", W, 4096, &c->kda_heads, err, cap));
    TRY(get_u32(cf, "linear_head_dim", W, 4096, &c->kda_dim, err, cap));
    TRY(get_u32(cf, "linear_conv_kernel_dim", W, 64, &c->conv_k, err, cap));
    uint32_t kvh;
    TRY(get_u32(cf, "num_attention_heads", W, 4096, &c->mla_heads, err, cap));
    TRY(get_u32(cf, "num_key_value_heads", W, 4096, &kvh, err, cap));
    TRY(get_u32(cf, "kv_lora_rank", W, MAX_DIM, &c->kv_rank, err, cap));
    TRY(get_u32(cf, "q_lora_rank", W, MAX_DIM, &c->q_rank, err, cap));
    TRY(get_u32(cf, "qk_nope_head_dim", W, 65536, &c->d_nope, err, cap));
    TRY(get_u32(cf, "qk_rope_head_dim", W, 65536, &c->d_rope, err, cap));
    TRY(get_u32(cf, "v_head_dim", W, 65536, &c->d_v, err, cap));
    TRY(get_num(cf, "rms_norm_eps", W, 0.0, 1.0, &c->rms_eps, err, cap));
    TRY(get_num(cf, "mla_norm_eps", W, 0.0, 1.0, &c->mla_eps, err, cap));
    TRY(get_num(cf, "kda_l2_eps", W, 0.0, 1.0, &c->l2_eps, err, cap));
    TRY(get_opt_id(cf, "bos_token_id", &c->bos, err, cap));
    TRY(get_opt_id(cf, "eos_token_id", &c->eos, err, cap));
    TRY(get_opt_id(cf, "pad_token_id", &c->pad, err, cap));
    TRY(get_u64(cf, "model_max_length", W, &c->ctx_train, err, cap));
    TRY(parse_k3(cf, c, act, err, cap));
    if (c->hidden == 0 || c->vocab == 0 || c->n_layers == 0) {
        wu_errf(err, cap, "manifest.json: config.hidden_size, vocab_size and num_hidden_layers must be > 0");
        return WASTE_E_FORMAT;
    }
    const struct { const char *key; int32_t id; } ids[] = {{"bos_token_id", c->bos}, {"eos_token_id", c->eos}, {"pad_token_id", c->pad}};
    for (int i = 0; i < 3; i++)
        if (ids[i].id >= 0 && (uint32_t)ids[i].id >= c->vocab) {
            wu_errf(err, cap, "manifest.json: config.%s %d is not below vocab_size %u", ids[i].key, ids[i].id, c->vocab);
            return WASTE_E_FORMAT;
        }
    if (kvh != c->mla_heads) {
        wu_errf(err, cap, "manifest.json: config.num_key_value_heads (%u) must equal num_attention_heads (%u)", kvh, c->mla_heads);
        return WASTE_E_FORMAT;
    }
    if (c->n_group > 1) {
        wu_errf(err, cap, "manifest.json: config.num_expert_group %u > 1 (grouped routing) is not supported", c->n_group);
        return WASTE_E_UNSUPPORTED;
    }
    const wj_val *lt = wj_get(cf, "layer_types"), *mt = wj_get(cf, "mlp_layer_types");
    if (!lt || lt->type != WJ_ARR || lt->n_children != c->n_layers) {
        wu_errf(err, cap, "manifest.json: config.layer_types must be a list of num_hidden_layers (%u) strings", c->n_layers);
        return WASTE_E_FORMAT;
    }
    if (!mt || mt->type != WJ_ARR || mt->n_children != c->n_layers) {
        wu_errf(err, cap, "manifest.json: config.mlp_layer_types must be a list of num_hidden_layers (%u) strings", c->n_layers);
        return WASTE_E_FORMAT;
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const wj_val *a = wj_at(lt, l), *m = wj_at(mt, l);
        if (a->type != WJ_STR || (strcmp(a->str, "linear_attention") && strcmp(a->str, "full_attention"))) {
            wu_errf(err, cap, "manifest.json: config.layer_types[%u] must be \"linear_attention\" or \"full_attention\"", l);
            return WASTE_E_FORMAT;
        }
        if (m->type != WJ_STR || (strcmp(m->str, "dense") && strcmp(m->str, "sparse"))) {
            wu_errf(err, cap, "manifest.json: config.mlp_layer_types[%u] must be \"dense\" or \"sparse\"", l);
            return WASTE_E_FORMAT;
        }
        c->is_mla[l] = !strcmp(a->str, "full_attention");
        c->is_moe[l] = !strcmp(m->str, "sparse");
        c->n_mla += c->is_mla[l]; c->n_kda += !c->is_mla[l]; c->n_moe += c->is_moe[l];
    }
    if (c->n_kda && (c->kda_heads == 0 || c->kda_dim == 0 || c->conv_k == 0)) {
        wu_errf(err, cap, "manifest.json: config.linear_num_heads/linear_head_dim/linear_conv_kernel_dim must be > 0");
        return WASTE_E_FORMAT;
    }
    if (c->n_mla && (c->mla_heads == 0 || c->kv_rank == 0 || c->d_nope + c->d_rope == 0 || c->d_v == 0)) {
        wu_errf(err, cap, "manifest.json: config MLA dimensions must be > 0");
        return WASTE_E_FORMAT;
    }
    if (c->n_moe && (c->n_experts == 0 || c->top_k == 0 || c->top_k > c->n_experts || c->moe_inter == 0)) {
        wu_errf(err, cap, "manifest.json: config.num_experts_per_token must be in [1, num_experts] and widths > 0");
        return WASTE_E_FORMAT;
    }
    return WASTE_OK;
}

/* ==== tensors ====================================================================== */
/* The canonical names (docs/FORMAT.md §3.2) a layer of this config has. */
static int layer_has(const wc_config *c, uint32_t l, const char *suffix) {
    static const char *common[] = {"attn_norm", "ffn_norm", NULL};
    static const char *kda[] = {"kda.q_proj", "kda.k_proj", "kda.v_proj", "kda.q_conv", "kda.k_conv", "kda.v_conv",
                                "kda.a_log", "kda.dt_bias", "kda.f_a", "kda.f_b", "kda.b_proj", "kda.o_norm",
                                "kda.o_proj", NULL};
    static const char *kda_gate[] = {"kda.g_a", "kda.g_b", NULL}, *kda_full[] = {"kda.g_proj", NULL};
    static const char *mla[] = {"mla.kv_a", "mla.kv_a_norm", "mla.kv_b", "mla.o_proj", NULL};
    static const char *mla_q[] = {"mla.q_proj", NULL}, *mla_qlora[] = {"mla.q_a", "mla.q_a_norm", "mla.q_b", NULL};
    static const char *mla_gate[] = {"mla.g_proj", NULL};
    static const char *dense[] = {"ffn.gate", "ffn.up", "ffn.down", NULL};
    static const char *moe[] = {"moe.router", "moe.router_bias", NULL};
    static const char *shared[] = {"moe.shared_gate", "moe.shared_up", "moe.shared_down", NULL};
    static const char *latent[] = {"moe.latent_down", "moe.latent_up", NULL}, *latent_norm[] = {"moe.latent_norm", NULL};
    static const char *res[] = {"res.attn_norm", "res.attn_proj", "res.mlp_norm", "res.mlp_proj", NULL};
    int m = c->is_mla[l], e = c->is_moe[l];
    const char **lists[] = {common, m ? mla : kda, m ? (c->q_rank ? mla_qlora : mla_q) : NULL,
                            m ? (c->mla_gate ? mla_gate : NULL) : (c->kda_full_gate ? kda_full : kda_gate),
                            e ? moe : dense, e && c->n_shared ? shared : NULL, e && c->rz ? latent : NULL,
                            e && c->rz && c->latent_norm ? latent_norm : NULL, c->res_block ? res : NULL};
    for (unsigned i = 0; i < sizeof lists / sizeof lists[0]; i++)
        for (const char **n = lists[i]; n && *n; n++)
            if (!strcmp(*n, suffix)) return 1;
    return 0;
}

/* 1 if name is a tensor this config uses: embed, final_norm, lm_head, or blk.<layer>.<x>
 * (a decimal layer below num_hidden_layers without leading zeros, x one of its tensors).
 * Anything else would be loaded and counted in params_* without being used. */
static int canonical_name(const wc_config *c, const char *name) {
    if (!strcmp(name, "embed") || !strcmp(name, "final_norm") || !strcmp(name, "lm_head")) return 1;
    if (c->res_block && (!strcmp(name, "output_res.norm") || !strcmp(name, "output_res.proj"))) return 1;
    if (strncmp(name, "blk.", 4)) return 0;
    const char *p = name + 4;
    uint64_t l = 0;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return 0;
    while (*p >= '0' && *p <= '9' && l < WC_MAX_LAYERS) l = l * 10 + (uint64_t)(*p++ - '0');
    if (*p != '.' || l >= c->n_layers) return 0;
    return layer_has(c, (uint32_t)l, p + 1);
}


/* Sorts c->by_name by tensor name (heapsort: qsort has no context pointer, and the library
 * keeps no mutable globals). */
static int name_less(const wc_container *c, uint32_t a, uint32_t b) {
    return strcmp(c->tensors[a].name, c->tensors[b].name) < 0;
}
static void sift_down(wc_container *c, uint32_t root, uint32_t n) {
    uint32_t *v = c->by_name;
    for (;;) {
        uint64_t child = 2ull * root + 1;
        if (child >= n) return;
        if (child + 1 < n && name_less(c, v[child], v[child + 1])) child++;
        if (!name_less(c, v[root], v[child])) return;
        uint32_t t = v[root]; v[root] = v[child]; v[child] = t;
        root = (uint32_t)child;
    }
}
static void sort_names(wc_container *c) {
    uint32_t n = c->n_tensors, *v = c->by_name;
    for (uint32_t i = n / 2; i-- > 0;) sift_down(c, i, n);
    for (uint32_t end = n; end-- > 1;) {
        uint32_t t = v[0]; v[0] = v[end]; v[end] = t;
        sift_down(c, 0, end);
    }
}

static int32_t parse_tensors(const wj_val *arr, wc_container *c, char *err, uint64_t cap) {
    if (!arr || arr->type != WJ_ARR) { wu_errf(err, cap, "manifest.json: missing field tensors"); return WASTE_E_FORMAT; }
    if (arr->n_children > MAX_TENSORS) { wu_errf(err, cap, "manifest.json: more than %u tensors", MAX_TENSORS); return WASTE_E_FORMAT; }
    c->n_tensors = arr->n_children;
    c->tensors = calloc(c->n_tensors ? c->n_tensors : 1, sizeof(wc_tensor));
    if (!c->tensors) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    uint32_t i = 0;
    for (const wj_val *v = arr->child; v; v = v->next, i++) {
        wc_tensor *t = &c->tensors[i];
        char where[128]; snprintf(where, sizeof where, "tensors[%u]", i);
        if (v->type != WJ_OBJ) { wu_errf(err, cap, "manifest.json: %s must be an object", where); return WASTE_E_FORMAT; }
        const char *name, *fmt, *file;
        TRY(get_str(v, "name", where, &name, err, cap));
        if (strlen(name) >= sizeof t->name) { wu_errf(err, cap, "manifest.json: %s.name too long", where); return WASTE_E_FORMAT; }
        strcpy(t->name, name);
        snprintf(where, sizeof where, "tensor %s", t->name);
        if (!canonical_name(&c->cfg, t->name)) {
            wu_errf(err, cap, "manifest.json: %s is not a tensor of this config (docs/FORMAT.md §3.2 lists the names)", where);
            return WASTE_E_FORMAT;
        }
        TRY(get_str(v, "format", where, &fmt, err, cap));
        t->fmt = wf_parse(fmt);
        if (t->fmt < 0) { wu_errf(err, cap, "manifest.json: %s: unknown format \"%s\"", where, fmt); return WASTE_E_FORMAT; }
        TRY(get_u32(v, "group", where, 128, &t->group, err, cap));
        TRY(get_str(v, "file", where, &file, err, cap));
        if (strcmp(file, "trunk.bin")) { wu_errf(err, cap, "manifest.json: %s: file must be trunk.bin", where); return WASTE_E_FORMAT; }
        TRY(get_u64(v, "offset", where, &t->offset, err, cap));
        TRY(get_u64(v, "length", where, &t->length, err, cap));
        TRY(get_bool(v, "on_disk", where, &t->on_disk, err, cap));
        /* Only the input embedding is read row by row; every other tensor is used whole, so
         * it must be resident (docs/ENGINE.md §3). */
        if (t->on_disk && strcmp(t->name, "embed")) {
            wu_errf(err, cap, "manifest.json: %s: on_disk is allowed only for the input embedding (embed)", where);
            return WASTE_E_FORMAT;
        }
        const wj_val *sh = wj_get(v, "shape");
        if (!sh || sh->type != WJ_ARR || sh->n_children < 1 || sh->n_children > 2) {
            wu_errf(err, cap, "manifest.json: %s: shape must be a list of 1 or 2 dimensions", where); return WASTE_E_FORMAT;
        }
        t->ndim = sh->n_children;
        for (uint32_t d = 0; d < t->ndim; d++) {
            const wj_val *x = wj_at(sh, d);
            if (x->type != WJ_NUM || !x->is_int || x->i <= 0 || x->i > (int64_t)MAX_DIM) {
                wu_errf(err, cap, "manifest.json: %s: shape[%u] must be in [1, %u]", where, d, MAX_DIM); return WASTE_E_FORMAT;
            }
            t->shape[d] = (uint64_t)x->i;
        }
        uint64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
        uint64_t rb = wf_row_bytes(t->fmt, t->group, cols), need;
        if (t->fmt <= WF_BF16 && t->group != 0) rb = 0;
        if (rb == 0 || !wu_mul(rb, rows, &need)) {
            wu_errf(err, cap, "manifest.json: %s: shape does not fit format %s group %u", where, fmt, t->group); return WASTE_E_FORMAT;
        }
        if (need != t->length) {
            wu_errf(err, cap, "manifest.json: %s: length %llu but shape x format needs %llu", where,
                    (unsigned long long)t->length, (unsigned long long)need); return WASTE_E_FORMAT;
        }
        if (t->offset % 64) { wu_errf(err, cap, "manifest.json: %s: offset %llu is not 64-byte aligned", where, (unsigned long long)t->offset); return WASTE_E_FORMAT; }
    }
    /* A sorted index: duplicates become neighbours, and wc_find is a binary search. */
    c->by_name = malloc((c->n_tensors ? c->n_tensors : 1) * sizeof *c->by_name);
    if (!c->by_name) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    for (uint32_t k = 0; k < c->n_tensors; k++) c->by_name[k] = k;
    sort_names(c);
    for (uint32_t k = 1; k < c->n_tensors; k++)
        if (!strcmp(c->tensors[c->by_name[k]].name, c->tensors[c->by_name[k - 1]].name)) {
            wu_errf(err, cap, "manifest.json: duplicate tensor %s", c->tensors[c->by_name[k]].name); return WASTE_E_FORMAT;
        }
    return WASTE_OK;
}

/* ==== banks ======================================================================== */
static int32_t parse_banks(const wj_val *arr, wc_container *c, char *err, uint64_t cap) {
    const wc_config *cf = &c->cfg;
    for (uint32_t l = 0; l < WC_MAX_LAYERS; l++) c->bank_of_layer[l] = -1;
    if (!arr || arr->type != WJ_ARR) { wu_errf(err, cap, "manifest.json: missing field banks"); return WASTE_E_FORMAT; }
    if (arr->n_children != cf->n_moe) {
        wu_errf(err, cap, "manifest.json: banks has %u entries but config has %u sparse layers", arr->n_children, cf->n_moe);
        return WASTE_E_FORMAT;
    }
    c->n_banks = arr->n_children;
    c->banks = calloc(c->n_banks ? c->n_banks : 1, sizeof(wc_bank));
    if (!c->banks) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    uint32_t i = 0;
    for (const wj_val *v = arr->child; v; v = v->next, i++) {
        wc_bank *b = &c->banks[i];
        b->fd = -1;
        char where[32]; snprintf(where, sizeof where, "banks[%u]", i);
        if (v->type != WJ_OBJ) { wu_errf(err, cap, "manifest.json: %s must be an object", where); return WASTE_E_FORMAT; }
        const char *file, *fmt;
        TRY(get_u32(v, "layer", where, cf->n_layers - 1, &b->layer, err, cap));
        if (!cf->is_moe[b->layer] || c->bank_of_layer[b->layer] >= 0) {
            wu_errf(err, cap, "manifest.json: %s.layer %u is not a sparse layer or is repeated", where, b->layer); return WASTE_E_FORMAT;
        }
        /* Layer order: bank index order is (layer, expert) order for the hotlist (§8). */
        if (i > 0 && b->layer < c->banks[i - 1].layer) {
            wu_errf(err, cap, "manifest.json: %s.layer %u comes after banks[%u].layer %u: banks must be in layer order", where,
                    b->layer, i - 1, c->banks[i - 1].layer);
            return WASTE_E_FORMAT;
        }
        TRY(get_str(v, "file", where, &file, err, cap));
        char expect[48]; snprintf(expect, sizeof expect, "experts-L%u.bin", b->layer);
        if (strcmp(file, expect)) { wu_errf(err, cap, "manifest.json: %s.file must be %s", where, expect); return WASTE_E_FORMAT; }
        if (strlen(c->dir) + strlen(file) + 2 > sizeof b->path) { wu_errf(err, cap, "bank path too long"); return WASTE_E_ARG; }
        strcpy(b->path, c->dir); strcat(b->path, "/"); strcat(b->path, file);
        TRY(get_u32(v, "n_experts", where, MAX_EXPERTS, &b->n_experts, err, cap));
        if (b->n_experts != cf->n_experts) { wu_errf(err, cap, "manifest.json: %s.n_experts %u != config.num_experts %u", where, b->n_experts, cf->n_experts); return WASTE_E_FORMAT; }
        TRY(get_str(v, "format", where, &fmt, err, cap));
        b->fmt = wf_parse(fmt);
        if (b->fmt < 0) { wu_errf(err, cap, "manifest.json: %s.format \"%s\" unknown", where, fmt); return WASTE_E_FORMAT; }
        TRY(get_u32(v, "group", where, 128, &b->group, err, cap));
        TRY(get_u64(v, "record_bytes", where, &b->record_bytes, err, cap));
        const wj_val *sh = wj_get(v, "shapes");
        if (!sh || sh->type != WJ_ARR || sh->n_children != 3) { wu_errf(err, cap, "manifest.json: %s.shapes must list 3 matrices", where); return WASTE_E_FORMAT; }
        uint64_t body = 0;
        for (uint32_t m = 0; m < 3; m++) {
            const wj_val *s = wj_at(sh, m);
            const wj_val *r = wj_at(s, 0), *k = wj_at(s, 1);
            if (!s || s->type != WJ_ARR || s->n_children != 2 || r->type != WJ_NUM || !r->is_int || k->type != WJ_NUM || !k->is_int ||
                r->i <= 0 || k->i <= 0 || r->i > (int64_t)MAX_DIM || k->i > (int64_t)MAX_DIM) {
                wu_errf(err, cap, "manifest.json: %s.shapes[%u] must be [rows, cols] in [1, %u]", where, m, MAX_DIM); return WASTE_E_FORMAT;
            }
            b->rows[m] = (uint32_t)r->i; b->cols[m] = (uint32_t)k->i;
        }
        /* The experts read z (routed_expert_hidden_size wide) under a latent MoE, else x. */
        uint32_t H = cf->rz ? cf->rz : cf->hidden, I = cf->moe_inter;
        if (b->rows[0] != I || b->cols[0] != H || b->rows[1] != I || b->cols[1] != H || b->rows[2] != H || b->cols[2] != I) {
            wu_errf(err, cap, "manifest.json: %s.shapes must be [[%u,%u],[%u,%u],[%u,%u]]", where, I, H, I, H, H, I); return WASTE_E_FORMAT;
        }
        for (uint32_t m = 0; m < 3; m++) {
            uint64_t rb = wf_row_bytes(b->fmt, b->group, b->cols[m]), len;
            if (b->fmt <= WF_BF16 && b->group != 0) rb = 0;
            if (rb == 0 || !wu_mul(rb, b->rows[m], &len)) { wu_errf(err, cap, "manifest.json: %s: shapes do not fit format %s group %u", where, fmt, b->group); return WASTE_E_FORMAT; }
            b->block_off[m] = body; b->block_len[m] = len;
            if (!wu_add(body, (len + 63) / 64 * 64, &body)) { wu_errf(err, cap, "manifest.json: %s: record too large", where); return WASTE_E_FORMAT; }
        }
        b->body_length = b->block_off[2] + b->block_len[2];
        uint64_t need = (REC_HEADER + b->body_length + 4095) / 4096 * 4096;
        if (b->record_bytes != need) {
            wu_errf(err, cap, "manifest.json: %s.record_bytes %llu but the shapes need %llu", where,
                    (unsigned long long)b->record_bytes, (unsigned long long)need); return WASTE_E_FORMAT;
        }
        c->bank_of_layer[b->layer] = (int32_t)i;
        if (b->record_bytes > c->max_record_bytes) c->max_record_bytes = b->record_bytes;
        uint64_t all;
        if (!wu_mul(b->record_bytes, b->n_experts, &all) || !wu_add(c->all_expert_bytes, all, &c->all_expert_bytes)) {
            wu_errf(err, cap, "manifest.json: %s: expert bytes overflow", where); return WASTE_E_FORMAT;
        }
        if (i == 0) { snprintf(c->expert_fmt, sizeof c->expert_fmt, "%s", fmt); c->expert_group = b->group; }
    }
    return WASTE_OK;
}

static int32_t parse_tokenizer(const wj_val *tk, wc_container *c, char *err, uint64_t cap) {
    if (!tk) { wu_errf(err, cap, "manifest.json: missing field tokenizer (null when absent)"); return WASTE_E_FORMAT; }
    if (tk->type == WJ_NULL) return WASTE_OK;
    if (tk->type != WJ_OBJ) { wu_errf(err, cap, "manifest.json: tokenizer must be an object or null"); return WASTE_E_FORMAT; }
    const char *pre, *ranks, *specials;
    TRY(get_str(tk, "pretokenizer", "tokenizer", &pre, err, cap));
    if (strcmp(pre, "kimi")) { wu_errf(err, cap, "manifest.json: tokenizer.pretokenizer \"%s\" is not supported (only \"kimi\")", pre); return WASTE_E_UNSUPPORTED; }
    TRY(get_u32(tk, "n_base_vocab", "tokenizer", MAX_DIM, &c->n_base_vocab, err, cap));
    TRY(get_str(tk, "ranks", "tokenizer", &ranks, err, cap));
    TRY(get_str(tk, "specials", "tokenizer", &specials, err, cap));
    if (strchr(ranks, '/') || strchr(specials, '/')) { wu_errf(err, cap, "manifest.json: tokenizer file names must not contain '/'"); return WASTE_E_FORMAT; }
    snprintf(c->ranks_path, sizeof c->ranks_path, "%s/%s", c->dir, ranks);
    snprintf(c->specials_path, sizeof c->specials_path, "%s/%s", c->dir, specials);
    c->has_tokenizer = 1;
    return WASTE_OK;
}

/* Errors from the manifest's parsers say "manifest.json: ..."; the caller's error names the
 * whole path, so a server with several containers says which one. */
static int32_t with_path(int32_t st, const char *dir, const char *file, char *err, uint64_t cap) {
    size_t n = strlen(file);
    if (st && cap && strncmp(err, file, n) == 0 && err[n] == ':') {
        char why[WASTE_ERR_CAP];
        snprintf(why, sizeof why, "%s", err + n);
        wu_errf(err, cap, "%s/%s%s", dir, file, why);
    }
    return st;
}

static int32_t open_manifest(const char *dir, wc_container *c, char *err, uint64_t cap);

int32_t wc_open_manifest(const char *dir, wc_container *c, char *err, uint64_t cap) {
    return with_path(open_manifest(dir, c, err, cap), dir, "manifest.json", err, cap);
}

static int32_t open_manifest(const char *dir, wc_container *c, char *err, uint64_t cap) {
    memset(c, 0, sizeof *c);
    c->trunk_fd = -1;
    if (strlen(dir) >= 900) { wu_errf(err, cap, "container path too long"); return WASTE_E_ARG; }
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    char path[1100]; snprintf(path, sizeof path, "%s/manifest.json", dir);
    int fd;
    uint64_t size;
    int o = wu_open_regular(path, 0, &fd, &size);
    if (o == -2) { wu_errf(err, cap, "%s: not a regular file", path); return WASTE_E_IO; }
    if (o) { wu_errf(err, cap, "%s: cannot open: %s", path, strerror(errno)); return WASTE_E_IO; }
    if (size > MAX_MANIFEST) { close(fd); wu_errf(err, cap, "%s: larger than 16 MiB", path); return WASTE_E_FORMAT; }
    c->manifest_len = size;
    c->manifest_text = malloc((size_t)c->manifest_len + 1);
    if (!c->manifest_text) { close(fd); wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    int r = wu_pread_full(fd, c->manifest_text, c->manifest_len, 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);   /* the engine keeps its own copy (docs/ENGINE.md §5) */
    close(fd);
    if (r != 0) { wu_errf(err, cap, "%s: read failed", path); return WASTE_E_IO; }
    c->manifest_text[c->manifest_len] = 0;
    c->fingerprint = wu_fnv1a64(c->manifest_text, c->manifest_len);

    wj_doc *doc = NULL;
    int32_t st2 = wj_parse(c->manifest_text, c->manifest_len, &doc, err, cap);
    if (st2) return st2;
    const wj_val *root = wj_root(doc);
    int32_t res = WASTE_OK;
    do {
        if (root->type != WJ_OBJ) { wu_errf(err, cap, "manifest.json: the document must be an object"); res = WASTE_E_FORMAT; break; }
        const wj_val *fv = wj_get(root, "format_version");
        if (!fv) { wu_errf(err, cap, "manifest.json: missing field format_version"); res = WASTE_E_FORMAT; break; }
        if (fv->type != WJ_NUM || !fv->is_int || fv->i != WASTE_FORMAT_VERSION) {
            wu_errf(err, cap, "manifest.json: format_version %g is not supported (this engine reads %d)", fv->num, WASTE_FORMAT_VERSION);
            res = WASTE_E_FORMAT; break;
        }
        const char *arch;
        if ((res = get_str(root, "arch", "manifest", &arch, err, cap))) break;
        /* The engine keys every K3 delta on its config key, never on arch (docs/ENGINE.md §4.2). */
        if (strcmp(arch, "kimi_linear") && strcmp(arch, "kimi_k3")) {
            wu_errf(err, cap, "manifest.json: arch \"%s\" is not supported (this engine runs kimi_linear and kimi_k3)", arch);
            res = WASTE_E_UNSUPPORTED; break;
        }
        snprintf(c->arch, sizeof c->arch, "%s", arch);
        if ((res = parse_config(wj_get(root, "config"), &c->cfg, err, cap))) break;
        if ((res = parse_tensors(wj_get(root, "tensors"), c, err, cap))) break;
        if ((res = parse_banks(wj_get(root, "banks"), c, err, cap))) break;
        if ((res = parse_tokenizer(wj_get(root, "tokenizer"), c, err, cap))) break;
        const wj_val *q = wj_get(root, "quant");
        const wj_val *qt = wj_get(q, "trunk");
        snprintf(c->trunk_fmt, sizeof c->trunk_fmt, "%s", qt && qt->type == WJ_STR ? qt->str : "?");
    } while (0);
    wj_free(doc);
    if (res) return res;
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        wc_tensor *t = &c->tensors[i];
        if (!t->on_disk && !wu_add(c->resident_bytes, (t->length + 63) / 64 * 64, &c->resident_bytes)) {
            wu_errf(err, cap, "manifest.json: trunk size overflows"); return WASTE_E_FORMAT;
        }
    }
    return WASTE_OK;
}

const wc_tensor *wc_find(const wc_container *c, const char *name) {
    if (!c->by_name) return NULL;
    uint32_t lo = 0, hi = c->n_tensors;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int d = strcmp(c->tensors[c->by_name[mid]].name, name);
        if (d == 0) return &c->tensors[c->by_name[mid]];
        if (d < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

/* ==== data: trunk + banks ========================================================== */
static int32_t check_bank_header(const wc_bank *b, const uint8_t *h, char *err, uint64_t cap) {
    if (memcmp(h, "WSTBANK1", 8)) { wu_errf(err, cap, "%s: bad bank magic", b->path); return WASTE_E_FORMAT; }
    if (wu_read_u32le(h + 8) != 1) { wu_errf(err, cap, "%s: bank version %u unsupported", b->path, wu_read_u32le(h + 8)); return WASTE_E_FORMAT; }
    if (wu_read_u32le(h + 12) != b->layer || wu_read_u32le(h + 16) != b->n_experts ||
        (int32_t)wu_read_u32le(h + 20) != b->fmt || wu_read_u32le(h + 24) != b->group || wu_read_u32le(h + 28) != 3 ||
        wu_read_u64le(h + 56) != b->record_bytes || wu_read_u64le(h + 64) != b->body_length) {
        wu_errf(err, cap, "%s: bank header disagrees with the manifest (layer %u)", b->path, b->layer); return WASTE_E_FORMAT;
    }
    for (int m = 0; m < 3; m++)
        if (wu_read_u32le(h + 32 + 4 * m) != b->rows[m] || wu_read_u32le(h + 44 + 4 * m) != b->cols[m]) {
            wu_errf(err, cap, "%s: bank header shapes disagree with the manifest (layer %u)", b->path, b->layer); return WASTE_E_FORMAT;
        }
    return WASTE_OK;
}

int32_t wc_open_data(wc_container *c, int direct_io, int verify, char *io_note, uint64_t note_cap,
                     char *err, uint64_t cap) {
    (void)verify;
    char path[1100]; snprintf(path, sizeof path, "%s/trunk.bin", c->dir);
    int o = wu_open_regular(path, 0, &c->trunk_fd, &c->trunk_file_size);
    if (o == -2) { wu_errf(err, cap, "%s: not a regular file", path); return WASTE_E_IO; }
    if (o) { wu_errf(err, cap, "%s: cannot open: %s", path, strerror(errno)); return WASTE_E_IO; }
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        const wc_tensor *t = &c->tensors[i];
        uint64_t end;
        if (!wu_add(t->offset, t->length, &end) || end > c->trunk_file_size) {
            wu_errf(err, cap, "%s: tensor %s at offset %llu + length %llu lies beyond the file (%llu bytes)", path, t->name,
                    (unsigned long long)t->offset, (unsigned long long)t->length, (unsigned long long)c->trunk_file_size);
            return WASTE_E_FORMAT;
        }
    }
    c->trunk_mem = wu_huge_alloc(c->resident_bytes);
    if (!c->trunk_mem) { wu_errf(err, cap, "out of memory for the trunk (%llu bytes)", (unsigned long long)c->resident_bytes); return WASTE_E_NOMEM; }
    uint64_t at = 0;
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        wc_tensor *t = &c->tensors[i];
        if (t->on_disk) continue;
        t->data = c->trunk_mem + at;
        int r = wu_pread_full(c->trunk_fd, t->data, t->length, t->offset);
        if (r) { wu_errf(err, cap, "%s: reading tensor %s at offset %llu failed", path, t->name, (unsigned long long)t->offset); return WASTE_E_IO; }
        at += (t->length + 63) / 64 * 64;
    }
    /* The resident tensors now live in trunk_mem: their pages in the page cache would be a
     * second copy charged to the same memory cap, so they are dropped (docs/ENGINE.md §5).
     * A clean page only: the file is never written here. */
    posix_fadvise(c->trunk_fd, 0, 0, POSIX_FADV_DONTNEED);
    /* From here on only embedding rows are read: no read-ahead around them. */
    posix_fadvise(c->trunk_fd, 0, 0, POSIX_FADV_RANDOM);

    int all_direct = 1;
    if (io_note && note_cap) io_note[0] = 0;
    uint8_t *probe = NULL;
    for (uint32_t i = 0; i < c->n_banks; i++) {
        wc_bank *b = &c->banks[i];
        uint64_t bank_size = 0;
        o = wu_open_regular(b->path, 0, &b->fd, &bank_size);
        if (o == -2) { wu_errf(err, cap, "%s: not a regular file (layer %u)", b->path, b->layer); free(probe); return WASTE_E_IO; }
        if (o) { wu_errf(err, cap, "%s: cannot open (layer %u): %s", b->path, b->layer, strerror(errno)); free(probe); return WASTE_E_IO; }
        uint64_t need = 0;
        if (!wu_mul(b->record_bytes, b->n_experts, &need) || !wu_add(need, BANK_HEADER, &need)) { free(probe); return WASTE_E_FORMAT; }
        if (bank_size != need) {
            wu_errf(err, cap, "%s: size %llu bytes but header + %u records of %llu bytes = %llu (truncated or padded bank, layer %u)",
                    b->path, (unsigned long long)bank_size, b->n_experts, (unsigned long long)b->record_bytes,
                    (unsigned long long)need, b->layer);
            free(probe); return WASTE_E_FORMAT;
        }
        uint8_t hdr[BANK_HEADER];
        if (wu_pread_full(b->fd, hdr, BANK_HEADER, 0)) { wu_errf(err, cap, "%s: cannot read the bank header", b->path); free(probe); return WASTE_E_IO; }
        posix_fadvise(b->fd, 0, BANK_HEADER, POSIX_FADV_DONTNEED);
        int32_t hs = check_bank_header(b, hdr, err, cap);
        if (hs) { free(probe); return hs; }
        if (direct_io) {
            int dfd = -1, ok = 0;
            uint64_t dsize = 0;
            /* Reopened by name: check again that it is the same regular file's size. */
            int od = wu_open_regular(b->path, O_DIRECT, &dfd, &dsize);
            if (od == 0 && dsize != bank_size) { close(dfd); dfd = -1; }
            if (dfd >= 0) {
                if (!probe && (probe = wu_aligned_alloc(4096, c->max_record_bytes))) c->probe_bytes = c->max_record_bytes;
                if (probe && wu_pread_full(dfd, probe, b->record_bytes, BANK_HEADER) == 0) ok = 1;
                if (ok) { close(b->fd); b->fd = dfd; b->direct = 1; }
                else close(dfd);
            }
            if (!ok) {
                all_direct = 0;
                if (io_note && note_cap && !io_note[0])
                    wu_errf(io_note, note_cap, "%s: O_DIRECT unavailable (%s); buffered reads with FADV_RANDOM/DONTNEED",
                            b->path, dfd < 0 ? strerror(errno) : "probe read failed");
            }
        } else {
            all_direct = 0;
            if (io_note && note_cap && !io_note[0]) wu_errf(io_note, note_cap, "direct_io disabled by cfg");
        }
        if (!b->direct) posix_fadvise(b->fd, 0, 0, POSIX_FADV_RANDOM);
    }
    free(probe);
    if (c->n_banks == 0 && io_note && note_cap && !io_note[0]) wu_errf(io_note, note_cap, "no expert banks");
    return all_direct && c->n_banks ? 1 : 0; /* >= 0: success, value = every bank direct */
}

void wc_close(wc_container *c) {
    if (!c) return;
    for (uint32_t i = 0; i < c->n_banks; i++) if (c->banks[i].fd >= 0) close(c->banks[i].fd);
    if (c->trunk_fd >= 0) close(c->trunk_fd);
    free(c->banks); free(c->tensors); free(c->by_name); free(c->trunk_mem); free(c->manifest_text);
    memset(c, 0, sizeof *c);
    c->trunk_fd = -1;
}

/* ==== records ====================================================================== */
int32_t wc_read_record(const wc_container *c, const wc_bank *b, uint32_t e, uint8_t *buf, int verify,
                       char *err, uint64_t cap) {
    (void)c;
    uint64_t off = BANK_HEADER + (uint64_t)e * b->record_bytes;
    int r = wu_pread_full(b->fd, buf, b->record_bytes, off);
    if (r) {
        wu_errf(err, cap, "%s: %s reading expert %u of layer %u at offset %llu", b->path,
                r == -2 ? "unexpected EOF" : strerror(errno), e, b->layer, (unsigned long long)off);
        return WASTE_E_IO;
    }
    if (!b->direct) posix_fadvise(b->fd, (off_t)off, (off_t)b->record_bytes, POSIX_FADV_DONTNEED);
    if (memcmp(buf, "WSTREC01", 8) || wu_read_u32le(buf + 8) != 1) {
        wu_errf(err, cap, "%s: expert %u of layer %u: bad record magic or version", b->path, e, b->layer); return WASTE_E_FORMAT;
    }
    if (wu_read_u32le(buf + 12) != b->layer || wu_read_u32le(buf + 16) != e) {
        wu_errf(err, cap, "%s: expert %u of layer %u: record says layer %u expert %u", b->path, e, b->layer,
                wu_read_u32le(buf + 12), wu_read_u32le(buf + 16)); return WASTE_E_FORMAT;
    }
    int bad = (int32_t)wu_read_u32le(buf + 20) != b->fmt || wu_read_u32le(buf + 24) != b->group ||
              wu_read_u32le(buf + 28) != 3 || wu_read_u64le(buf + 104) != b->body_length;
    for (int m = 0; m < 3 && !bad; m++)
        bad = wu_read_u32le(buf + 32 + 4 * m) != b->rows[m] || wu_read_u32le(buf + 44 + 4 * m) != b->cols[m] ||
              wu_read_u64le(buf + 56 + 8 * m) != b->block_off[m] || wu_read_u64le(buf + 80 + 8 * m) != b->block_len[m];
    if (bad) { wu_errf(err, cap, "%s: expert %u of layer %u: record header disagrees with the bank", b->path, e, b->layer); return WASTE_E_FORMAT; }
    if (verify) {
        uint32_t want = wu_read_u32le(buf + 112), got = wu_crc32(buf + REC_HEADER, b->body_length);
        if (want != got) {
            wu_errf(err, cap, "%s: expert %u of layer %u: checksum mismatch (crc32 %08x, record says %08x)", b->path, e,
                    b->layer, got, want);
            return WASTE_E_IO;
        }
    }
    /* E8M0 byte 255 is NaN: refused for every read, verify or not (docs/FORMAT.md §2). */
    if (b->fmt == WF_MXFP4) {
        static const char *const mat[3] = {"gate", "up", "down"};
        for (int m = 0; m < 3; m++) {
            uint32_t row, group;
            if (wk_mxfp4_find_nan_scale(buf + REC_HEADER + b->block_off[m], b->rows[m], b->cols[m], &row, &group)) {
                wu_errf(err, cap, "%s: expert %u of layer %u: mxfp4 scale byte 255 (NaN) in %s row %u group %u", b->path, e,
                        b->layer, mat[m], row, group);
                return WASTE_E_FORMAT;
            }
        }
    }
    return WASTE_OK;
}

int32_t wc_read_embed_row(const wc_container *c, const wc_tensor *t, uint32_t row, uint8_t *tmp, float *out,
                          char *err, uint64_t cap) {
    uint64_t rb = wf_row_bytes(t->fmt, t->group, t->shape[1]);
    uint64_t off = t->offset + (uint64_t)row * rb;
    const uint8_t *src;
    if (t->data) src = t->data + (uint64_t)row * rb;
    else {
        int r = wu_pread_full(c->trunk_fd, tmp, rb, off);
        if (r) { wu_errf(err, cap, "%s/trunk.bin: reading row %u of %s at offset %llu failed", c->dir, row, t->name, (unsigned long long)off); return WASTE_E_IO; }
        /* One row per token: keep no pages. DONTNEED drops only whole pages inside the
         * range, so the range is widened to the pages the row touches. */
        uint64_t lo = off & ~(uint64_t)4095, hi = (off + rb + 4095) & ~(uint64_t)4095;
        posix_fadvise(c->trunk_fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
        src = tmp;
    }
    wm_mat m = {t->fmt, t->group, 1, (uint32_t)t->shape[1], rb, src};
    wk_decode_row(&m, 0, out);
    return WASTE_OK;
}
