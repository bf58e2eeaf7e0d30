/* snapshot.c — saving and restoring the state of a context (snapshot.h, docs/FORMAT.md
 * §7): "WSTSNAP1", version, layer count, model fingerprint, position, the ids, then each
 * layer's state in layer order, then a crc32 of everything before it. */
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
    return WASTE_OK;
}
