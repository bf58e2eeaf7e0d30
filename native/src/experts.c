/* experts.c — the expert store: fixed 4096-aligned slots allocated at open, an index
 * (layer, expert) → slot, pins, hits and last use. Misses read one record with one pread
 * (container.c) into a free slot, else evict among 16 sampled unpinned slots (LFRU: fewest
 * hits, oldest on ties; LRU: oldest), scanning all when every sample is pinned. A miss is
 * never skipped or substituted: with no evictable slot the call fails with E_BUDGET.
 * v1 uses a linear index and no read-ahead; the hotlist and io_threads come later. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

int32_t we_init(we_cache *c, uint64_t slot_bytes, uint32_t n_slots, int32_t policy, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->slot_bytes = slot_bytes; c->n_slots = n_slots; c->policy = policy;
    c->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    if (n_slots == 0) return WASTE_OK;
    uint64_t total;
    if (!wu_mul(slot_bytes, n_slots, &total)) return WASTE_E_NOMEM;
    c->mem = wu_aligned_alloc(4096, total);
    c->layer = malloc(n_slots * sizeof(int32_t));
    c->expert = malloc(n_slots * sizeof(int32_t));
    c->last_use = calloc(n_slots, sizeof(uint64_t));
    c->hits = calloc(n_slots, sizeof(uint64_t));
    c->pin = calloc(n_slots, sizeof(uint32_t));
    if (!c->mem || !c->layer || !c->expert || !c->last_use || !c->hits || !c->pin) { we_free(c); return WASTE_E_NOMEM; }
    for (uint32_t i = 0; i < n_slots; i++) { c->layer[i] = -1; c->expert[i] = -1; }
    return WASTE_OK;
}

void we_free(we_cache *c) {
    free(c->mem); free(c->layer); free(c->expert); free(c->last_use); free(c->hits); free(c->pin);
    memset(c, 0, sizeof *c);
}

void we_unpin_all(we_cache *c) {
    for (uint32_t i = 0; i < c->n_slots; i++) c->pin[i] = 0;
}

static uint64_t next_rand(we_cache *c) {
    uint64_t x = c->rng; x ^= x << 13; x ^= x >> 7; x ^= x << 17; c->rng = x; return x;
}

static int better_victim(const we_cache *c, uint32_t a, int32_t b) {
    if (b < 0) return 1;
    if (c->policy == WASTE_CACHE_LFRU && c->hits[a] != c->hits[b]) return c->hits[a] < c->hits[b];
    return c->last_use[a] < c->last_use[b];
}

static int32_t pick_slot(we_cache *c) {
    if (c->used < c->n_slots) return (int32_t)c->used++;
    int32_t best = -1;
    for (int i = 0; i < 16; i++) {
        uint32_t s = (uint32_t)(next_rand(c) % c->n_slots);
        if (!c->pin[s] && better_victim(c, s, best)) best = (int32_t)s;
    }
    if (best < 0)
        for (uint32_t s = 0; s < c->n_slots; s++)
            if (!c->pin[s] && better_victim(c, s, best)) best = (int32_t)s;
    return best;
}

int32_t we_get(waste_ctx *ctx, uint32_t bank, uint32_t e, const uint8_t **rec) {
    we_cache *c = &ctx->cache;
    const wc_bank *b = &ctx->c.banks[bank];
    c->tick++;
    for (uint32_t s = 0; s < c->used; s++) {
        if (c->layer[s] == (int32_t)b->layer && c->expert[s] == (int32_t)e) {
            c->hits[s]++; c->last_use[s] = c->tick; c->pin[s]++;
            ctx->call_hits++; atomic_fetch_add(&ctx->st_hits, 1);
            *rec = c->mem + (uint64_t)s * c->slot_bytes;
            return WASTE_OK;
        }
    }
    int32_t s = pick_slot(c);
    if (s < 0) {
        wx_err(ctx, "no evictable expert slot for expert %u of layer %u (%u slots, all pinned)", e, b->layer, c->n_slots);
        return WASTE_E_BUDGET;
    }
    uint8_t *dst = c->mem + (uint64_t)s * c->slot_bytes;
    c->layer[s] = -1; c->expert[s] = -1;
    double t0 = wu_now_ms();
    int32_t st = wc_read_record(&ctx->c, b, e, dst, (int)ctx->verify, ctx->err, sizeof ctx->err);
    double dt = wu_now_ms() - t0;
    ctx->call_io_ms += dt;
    atomic_fetch_add(&ctx->st_io_us, (uint64_t)(dt * 1000.0));
    atomic_fetch_add(&ctx->st_reads, 1);
    if (st) return st;
    c->layer[s] = (int32_t)b->layer; c->expert[s] = (int32_t)e;
    c->hits[s] = 1; c->last_use[s] = c->tick; c->pin[s] = 1;
    ctx->call_misses++; ctx->call_bytes += b->record_bytes;
    atomic_fetch_add(&ctx->st_misses, 1);
    atomic_fetch_add(&ctx->st_bytes, b->record_bytes);
    *rec = dst;
    return WASTE_OK;
}
