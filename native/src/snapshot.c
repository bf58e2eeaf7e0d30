/* snapshot.c — saving and restoring the state of a context (snapshot.h, docs/FORMAT.md
 * §7): "WSTSNAP1", version, layer count, model fingerprint, position, the ids, then each
 * layer's state in layer order, then a crc32 of everything before it. Segments (§7.1) hold
 * only the positions appended since a parent segment, so that snapshots of one conversation
 * share their MLA latents (append-only) instead of copying them once per snapshot. */
#include <string.h>

#include "context.h"
#include "engine.h"
#include "snapshot.h"

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

uint64_t wsnap_size(const waste_ctx *ctx) { return snapshot_bytes(ctx, ctx->pos); }

int32_t wsnap_save(waste_ctx *ctx, void *buf, uint64_t cap, uint64_t *n_out) {
    uint64_t need = snapshot_bytes(ctx, ctx->pos);
    *n_out = need;
    if (cap < need) { wx_err(ctx, "snapshot needs %llu bytes, buffer holds %llu", (unsigned long long)need, (unsigned long long)cap); return WASTE_E_SPACE; }
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
    return WASTE_OK;
}

int32_t wsnap_load(waste_ctx *ctx, const void *buf, uint64_t len) {
    const uint8_t *p = buf;
    if (len < 36 || memcmp(p, "WSTSNAP1", 8)) { wx_err(ctx, "snapshot: bad magic or too short"); return WASTE_E_FORMAT; }
    if (wu_read_u32le(p + 8) != 1) { wx_err(ctx, "snapshot: version %u unsupported", wu_read_u32le(p + 8)); return WASTE_E_FORMAT; }
    if (wu_read_u32le(p + 12) != ctx->c.cfg.n_layers || wu_read_u64le(p + 16) != ctx->c.fingerprint) {
        wx_err(ctx, "snapshot: taken from a different model (fingerprint or layer count differs)"); return WASTE_E_FORMAT;
    }
    uint64_t pos = wu_read_u64le(p + 24);
    if (pos > ctx->ctx_tokens) { wx_err(ctx, "snapshot: position %llu exceeds ctx_tokens %u", (unsigned long long)pos, ctx->ctx_tokens); return WASTE_E_FORMAT; }
    uint64_t need = snapshot_bytes(ctx, pos);
    if (len != need) { wx_err(ctx, "snapshot: %llu bytes, expected %llu", (unsigned long long)len, (unsigned long long)need); return WASTE_E_FORMAT; }
    if (wu_read_u32le(p + len - 4) != wu_crc32(p, len - 4)) { wx_err(ctx, "snapshot: crc32 mismatch"); return WASTE_E_FORMAT; }
    for (uint64_t i = 0; i < pos; i++) {
        int32_t id = (int32_t)wu_read_u32le(p + 32 + 4 * i);
        if (id < 0 || (uint32_t)id >= ctx->c.cfg.vocab) { wx_err(ctx, "snapshot: token %llu out of range", (unsigned long long)i); return WASTE_E_FORMAT; }
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
    ctx->seg_anchored = 0;   /* a whole snapshot is no segment: the next one is a root */
    return WASTE_OK;
}

/* ==== segments (docs/FORMAT.md §7.1) ================================================ */
enum { SEG_HEADER = 48, SEG_VERSION = 2 };

/* Bytes of a segment covering positions [base, pos): the header, the ids, the KDA state
 * whole, the MLA latents of those positions only, the crc. */
static uint64_t segment_bytes(const waste_ctx *ctx, uint64_t base, uint64_t pos) {
    uint64_t n = SEG_HEADER + 4 * (pos - base) + 4;
    for (uint32_t l = 0; l < ctx->c.cfg.n_layers; l++)
        n += 4 * (ctx->c.cfg.is_mla[l] ? layer_state_floats(ctx, l, pos - base)
                                       : layer_state_floats(ctx, l, 0));
    return n;
}

static uint64_t segment_base(const waste_ctx *ctx, int32_t whole) {
    return whole || !ctx->seg_anchored ? 0 : ctx->seg_pos;
}

void wsnap_segment_size(const waste_ctx *ctx, int32_t whole, uint64_t *size, uint64_t *base) {
    uint64_t b = segment_base(ctx, whole);
    *size = segment_bytes(ctx, b, ctx->pos);
    *base = b;
}

int32_t wsnap_segment_save(waste_ctx *ctx, int32_t whole, void *buf, uint64_t cap, uint64_t *n_out) {
    uint64_t base = segment_base(ctx, whole), need = segment_bytes(ctx, base, ctx->pos);
    *n_out = need;
    if (cap < need) { wx_err(ctx, "snapshot segment needs %llu bytes, buffer holds %llu", (unsigned long long)need, (unsigned long long)cap); return WASTE_E_SPACE; }
    const wc_config *c = &ctx->c.cfg;
    uint64_t n = ctx->pos - base, row = (uint64_t)c->kv_rank + c->d_rope;
    uint8_t *p = buf;
    memcpy(p, "WSTSNAP1", 8);
    wu_write_u32le(p + 8, SEG_VERSION);
    wu_write_u32le(p + 12, c->n_layers);
    wu_write_u64le(p + 16, ctx->c.fingerprint);
    wu_write_u64le(p + 24, ctx->pos);
    wu_write_u64le(p + 32, base);
    wu_write_u32le(p + 40, base ? ctx->seg_crc : 0);
    wu_write_u32le(p + 44, 0);
    uint64_t at = SEG_HEADER;
    memcpy(p + at, ctx->ids + base, 4 * n); at += 4 * n;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (c->is_mla[l]) {
            // lat[l]: [ctx_tokens][r + dr]; positions [base, pos) are one contiguous run
            memcpy(p + at, ctx->lat[l] + base * row, 4 * n * row); at += 4 * n * row;
        } else {
            uint64_t hd = (uint64_t)c->kda_heads * c->kda_dim, nc = 4 * 3 * hd * (c->conv_k - 1);
            uint64_t ns = 4ull * c->kda_heads * c->kda_dim * c->kda_dim;
            memcpy(p + at, ctx->conv[l], nc); at += nc;
            memcpy(p + at, ctx->S[l], ns); at += ns;
        }
    }
    uint32_t crc = wu_crc32(p, at);
    wu_write_u32le(p + at, crc);
    ctx->seg_anchored = 1;
    ctx->seg_pos = ctx->pos;
    ctx->seg_crc = crc;
    return WASTE_OK;
}

/* Checks segment i of a chain whole; *end and *crc are its position and crc on return. */
static int32_t check_segment(waste_ctx *ctx, uint32_t i, const uint8_t *p, uint64_t len,
                             uint64_t prev_end, uint32_t prev_crc, uint64_t *end, uint32_t *crc) {
    if (!p) { wx_err(ctx, "snapshot chain: segment %u is NULL", i); return WASTE_E_ARG; }
    if (len < SEG_HEADER + 4 || memcmp(p, "WSTSNAP1", 8)) { wx_err(ctx, "snapshot chain: segment %u: bad magic or too short", i); return WASTE_E_FORMAT; }
    if (wu_read_u32le(p + 8) != SEG_VERSION) { wx_err(ctx, "snapshot chain: segment %u: version %u is not a segment (%d)", i, wu_read_u32le(p + 8), SEG_VERSION); return WASTE_E_FORMAT; }
    if (wu_read_u32le(p + 12) != ctx->c.cfg.n_layers || wu_read_u64le(p + 16) != ctx->c.fingerprint) {
        wx_err(ctx, "snapshot chain: segment %u taken from a different model (fingerprint or layer count differs)", i); return WASTE_E_FORMAT;
    }
    uint64_t pos = wu_read_u64le(p + 24), base = wu_read_u64le(p + 32);
    if (pos > ctx->ctx_tokens || base > pos) { wx_err(ctx, "snapshot chain: segment %u: positions [%llu, %llu) do not fit ctx_tokens %u", i, (unsigned long long)base, (unsigned long long)pos, ctx->ctx_tokens); return WASTE_E_FORMAT; }
    uint64_t need = segment_bytes(ctx, base, pos);
    if (len != need) { wx_err(ctx, "snapshot chain: segment %u: %llu bytes, expected %llu", i, (unsigned long long)len, (unsigned long long)need); return WASTE_E_FORMAT; }
    *crc = wu_read_u32le(p + len - 4);
    if (*crc != wu_crc32(p, len - 4)) { wx_err(ctx, "snapshot chain: segment %u: crc32 mismatch", i); return WASTE_E_FORMAT; }
    uint32_t parent = wu_read_u32le(p + 40);
    if (base != prev_end || (i > 0 && parent != prev_crc) || (i == 0 && parent != 0)) {
        wx_err(ctx, "snapshot chain: segment %u starts at %llu (parent crc %08x), not where segment %u ends (%llu, crc %08x)",
               i, (unsigned long long)base, parent, i ? i - 1 : 0, (unsigned long long)prev_end, i ? prev_crc : 0);
        return WASTE_E_FORMAT;
    }
    for (uint64_t k = 0; k < pos - base; k++) {
        int32_t id = (int32_t)wu_read_u32le(p + SEG_HEADER + 4 * k);
        if (id < 0 || (uint32_t)id >= ctx->c.cfg.vocab) { wx_err(ctx, "snapshot chain: segment %u: token %llu out of range", i, (unsigned long long)(base + k)); return WASTE_E_FORMAT; }
    }
    *end = pos;
    return WASTE_OK;
}

int32_t wsnap_chain_load(waste_ctx *ctx, const void *const *segs, const uint64_t *lens, uint32_t n) {
    uint64_t end = 0;
    uint32_t crc = 0;
    for (uint32_t i = 0; i < n; i++) {
        int32_t st = check_segment(ctx, i, segs[i], lens[i], end, crc, &end, &crc);
        if (st != WASTE_OK) return st;
    }
    /* Validated: now restore. Ids and latents from every segment, the KDA state from the last. */
    const wc_config *c = &ctx->c.cfg;
    uint64_t row = (uint64_t)c->kv_rank + c->d_rope;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p = segs[i];
        uint64_t pos = wu_read_u64le(p + 24), base = wu_read_u64le(p + 32), k = pos - base;
        memcpy(ctx->ids + base, p + SEG_HEADER, 4 * k);
        uint64_t at = SEG_HEADER + 4 * k;
        for (uint32_t l = 0; l < c->n_layers; l++) {
            if (c->is_mla[l]) {
                memcpy(ctx->lat[l] + base * row, p + at, 4 * k * row); at += 4 * k * row;
            } else {
                uint64_t hd = (uint64_t)c->kda_heads * c->kda_dim, nc = 4 * 3 * hd * (c->conv_k - 1);
                uint64_t ns = 4ull * c->kda_heads * c->kda_dim * c->kda_dim;
                if (i == n - 1) {
                    memcpy(ctx->conv[l], p + at, nc);
                    memcpy(ctx->S[l], p + at + nc, ns);
                }
                at += nc + ns;
            }
        }
    }
    ctx->pos = end;
    ctx->has_logits = 0;
    ctx->seg_anchored = 1;
    ctx->seg_pos = end;
    ctx->seg_crc = crc;
    return WASTE_OK;
}
