/* experts.c — the expert store: fixed 4096-aligned slots allocated at open, a direct map
 * (layer bank, expert) → slot, pins, hits, last use and per-expert access counts. Misses
 * read one record with one pread (container.c) into a free slot, else evict among 16
 * sampled unpinned slots (LFRU: fewest hits, oldest on ties; LRU: oldest), scanning all
 * when every sample is pinned. A miss is never skipped or substituted: with no evictable
 * slot the call fails with E_BUDGET. Open warms the slots from the hotlist's top counts.
 * No read-ahead yet (io_threads). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "engine.h"

/* ==== allocation =================================================================== */
/* Per slot entry: bank, expert (i32), last_use, hits (u64), pin (u32); per (bank, expert):
 * slot_of (i32) and counts (u64). */
#define SLOT_ENTRY_BYTES (4 + 4 + 8 + 8 + 4)
#define EXPERT_ENTRY_BYTES (4 + 8)

uint64_t we_table_bytes(uint64_t n_all) { return n_all * (SLOT_ENTRY_BYTES + EXPERT_ENTRY_BYTES); }

int32_t we_init(we_cache *c, uint64_t slot_bytes, uint32_t n_slots, uint32_t n_banks, uint32_t n_experts,
                int32_t policy, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->slot_bytes = slot_bytes; c->n_slots = n_slots; c->policy = policy;
    c->n_experts = n_experts; c->n_all = (uint64_t)n_banks * n_experts;
    c->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    if (c->n_all == 0) { c->n_slots = 0; return WASTE_OK; }
    if (n_slots > c->n_all) return WASTE_E_ARG;   /* the sizing caps slots at every expert */
    uint64_t total;
    if (!wu_mul(slot_bytes, n_slots, &total)) return WASTE_E_NOMEM;
    uint64_t n = c->n_all;
    c->mem = n_slots ? wu_aligned_alloc(4096, total) : NULL;
    c->bank = malloc(n * sizeof(int32_t));
    c->expert = malloc(n * sizeof(int32_t));
    c->last_use = calloc(n, sizeof(uint64_t));
    c->hits = calloc(n, sizeof(uint64_t));
    c->pin = calloc(n, sizeof(uint32_t));
    c->slot_of = malloc(n * sizeof(int32_t));
    c->counts = calloc(n, sizeof(uint64_t));
    if ((n_slots && !c->mem) || !c->bank || !c->expert || !c->last_use || !c->hits || !c->pin || !c->slot_of || !c->counts) {
        we_free(c);
        return WASTE_E_NOMEM;
    }
    c->held_bytes = (n_slots ? total : 0) + n * (2 * sizeof(int32_t) + 2 * sizeof(uint64_t) + sizeof(uint32_t)) +
                    n * (sizeof(int32_t) + sizeof(uint64_t));
    for (uint64_t i = 0; i < n; i++) { c->bank[i] = -1; c->expert[i] = -1; c->slot_of[i] = -1; }
    return WASTE_OK;
}

void we_free(we_cache *c) {
    free(c->mem); free(c->bank); free(c->expert); free(c->last_use); free(c->hits); free(c->pin);
    free(c->slot_of); free(c->counts);
    memset(c, 0, sizeof *c);
}

void we_unpin_all(we_cache *c) {
    for (uint32_t i = 0; i < c->n_slots; i++) c->pin[i] = 0;
}

/* ==== eviction ===================================================================== */
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

/* ==== lookup ======================================================================= */
int32_t we_get(waste_ctx *ctx, uint32_t bank, uint32_t e, const uint8_t **rec) {
    we_cache *c = &ctx->cache;
    const wc_bank *b = &ctx->c.banks[bank];
    uint64_t key = (uint64_t)bank * c->n_experts + e;
    c->tick++;
    /* docs/ENGINE.md §5 Counting: one access per call (per token in decode, per distinct expert
     * of a chunk in prefill). Saturating, so a merged hotlist can never wrap. */
    if (c->counts[key] != UINT64_MAX) c->counts[key]++;
    int32_t hit = c->slot_of[key];
    if (hit >= 0) {
        uint32_t s = (uint32_t)hit;
        c->hits[s]++; c->last_use[s] = c->tick; c->pin[s]++;
        ctx->call_hits++; atomic_fetch_add(&ctx->st_hits, 1);
        *rec = c->mem + (uint64_t)s * c->slot_bytes;
        return WASTE_OK;
    }
    int32_t s = pick_slot(c);
    if (s < 0) {
        wx_err(ctx, "no evictable expert slot for expert %u of layer %u (%u slots, all pinned)", e, b->layer, c->n_slots);
        return WASTE_E_BUDGET;
    }
    uint8_t *dst = c->mem + (uint64_t)s * c->slot_bytes;
    if (c->bank[s] >= 0) c->slot_of[(uint64_t)c->bank[s] * c->n_experts + (uint32_t)c->expert[s]] = -1;
    c->bank[s] = -1; c->expert[s] = -1;
    double t0 = wu_now_ms();
    int32_t st = wc_read_record(&ctx->c, b, e, dst, (int)ctx->verify, ctx->err, sizeof ctx->err);
    double dt = wu_now_ms() - t0;
    ctx->call_io_ms += dt;
    atomic_fetch_add(&ctx->st_io_us, (uint64_t)(dt * 1000.0));
    atomic_fetch_add(&ctx->st_reads, 1);
    if (st) return st;
    c->bank[s] = (int32_t)bank; c->expert[s] = (int32_t)e; c->slot_of[key] = s;
    c->hits[s] = 1; c->last_use[s] = c->tick; c->pin[s] = 1;
    ctx->call_misses++; ctx->call_bytes += b->record_bytes;
    atomic_fetch_add(&ctx->st_misses, 1);
    atomic_fetch_add(&ctx->st_bytes, b->record_bytes);
    *rec = dst;
    return WASTE_OK;
}

/* ==== warming from the hotlist ===================================================== */
typedef struct { uint64_t count; uint64_t key; } we_hot;

static int hotter_first(const void *pa, const void *pb) {
    const we_hot *a = pa, *b = pb;
    if (a->count != b->count) return a->count > b->count ? -1 : 1;
    return a->key < b->key ? -1 : a->key > b->key;   /* key order = layer, then expert */
}

int32_t we_warm(waste_ctx *ctx, char *err, uint64_t cap) {
    we_cache *c = &ctx->cache;
    uint64_t n_hot = 0;
    for (uint64_t k = 0; k < c->n_all; k++) n_hot += c->counts[k] > 0;
    if (n_hot == 0 || c->n_slots == 0) return WASTE_OK;
    uint64_t bytes = n_hot * sizeof(we_hot);
    we_hot *hot = malloc(bytes);
    if (!hot) { wu_errf(err, cap, "out of memory ranking %llu hotlist entries", (unsigned long long)n_hot); return WASTE_E_NOMEM; }
    wx_mem_add(ctx, bytes);
    uint64_t i = 0;
    for (uint64_t k = 0; k < c->n_all; k++) if (c->counts[k]) hot[i++] = (we_hot){c->counts[k], k};
    qsort(hot, n_hot, sizeof *hot, hotter_first);
    int32_t st = WASTE_OK;
    for (i = 0; i < n_hot && c->used < c->n_slots; i++) {
        uint32_t bank = (uint32_t)(hot[i].key / c->n_experts), e = (uint32_t)(hot[i].key % c->n_experts);
        const wc_bank *b = &ctx->c.banks[bank];
        uint32_t s = c->used;
        /* A damaged record is a container fault, reported as it would be on first use. */
        st = wc_read_record(&ctx->c, b, e, c->mem + (uint64_t)s * c->slot_bytes, (int)ctx->verify, err, cap);
        if (st) {
            char why[WASTE_ERR_CAP];
            snprintf(why, sizeof why, "%s", err);
            wu_errf(err, cap, "warming the expert cache from %s: %s", ctx->usage_path, why);
            break;
        }
        c->used++;
        c->tick++;
        c->bank[s] = (int32_t)bank; c->expert[s] = (int32_t)e; c->slot_of[hot[i].key] = (int32_t)s;
        c->hits[s] = 1; c->last_use[s] = c->tick; c->pin[s] = 0;
        ctx->warm_slots++;
        atomic_fetch_add(&ctx->st_warm_bytes, b->record_bytes);
    }
    free(hot);
    wx_mem_sub(ctx, bytes);
    return st;
}
