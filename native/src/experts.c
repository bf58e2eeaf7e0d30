/* experts.c — the expert store: fixed 4096-aligned slots allocated at open, a direct map
 * (layer bank, expert) → slot, pins, hits, last use and per-expert access counts. Misses
 * read one record with one pread (container.c) into a free slot, else into a victim chosen by
 * the policy (docs/ENGINE.md §5 Policy):
 * - LFRU / LRU: among 16 sampled unpinned slots, fewest hits then oldest / oldest; all slots
 *   are scanned when every sample is pinned.
 * - LAYER (the default): every unpinned slot is scanned, and the victim is the one whose next
 *   possible use is furthest away in the cycle of MoE layers a token walks through (the
 *   current layer's experts that this token does not select first, then the layer just
 *   computed, and so on backwards), the fewest accesses since open (`counts`) among those,
 *   the oldest on ties. A selected expert of the current layer is never the victim while
 *   another slot is evictable. Under a cache smaller than one token's working set this keeps
 *   a stable resident set per layer instead of cycling every slot through every layer (LRU's
 *   loop pattern, hit rate 0), so uniform routing hits about the cached fraction. One
 *   exception: when the least accessed evictable expert of any layer has clearly fewer
 *   accesses than that victim (more than 2 standard deviations of its count below it), it
 *   goes instead, so skewed routing gives a cold layer's slots to other layers' hot experts,
 *   while uniform routing (where differences in counts are noise) keeps its per-layer sets.
 * A miss is never skipped or substituted: with no evictable slot the call fails with
 * E_BUDGET. Open warms the slots from the hotlist's top counts. With reader threads
 * (io_threads) misses are queued and waited for per slot; the lookahead's guesses are read
 * into slots the policy would evict, unpinned once landed (docs/ENGINE.md §5 Reading ahead). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "engine.h"

/* ==== allocation =================================================================== */
/* Per slot entry: bank, expert (i32), last_use, hits (u64), pin (u32), req (i32), spec (u8); per (bank, expert):
 * slot_of (i32) and counts (u64). */
#define SLOT_ENTRY_BYTES (4 + 4 + 8 + 8 + 4 + 4 + 1)   /* + the read in flight (i32), speculative (u8) */
#define EXPERT_ENTRY_BYTES (4 + 8)

uint64_t we_table_bytes(uint64_t n_all) { return n_all * (SLOT_ENTRY_BYTES + EXPERT_ENTRY_BYTES); }

int32_t we_init(we_cache *c, uint64_t slot_bytes, uint32_t n_slots, uint32_t n_banks, uint32_t n_experts,
                int32_t policy, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->slot_bytes = slot_bytes; c->n_slots = n_slots; c->policy = policy; c->n_banks = n_banks; c->cur_bank = 0;
    c->n_experts = n_experts; c->n_all = (uint64_t)n_banks * n_experts;
    c->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    if (c->n_all == 0) { c->n_slots = 0; return WASTE_OK; }
    if (n_slots > c->n_all) return WASTE_E_ARG;   /* the sizing caps slots at every expert */
    uint64_t total;
    if (!wu_mul(slot_bytes, n_slots, &total)) return WASTE_E_NOMEM;
    uint64_t n = c->n_all;
    c->mem = n_slots ? wu_huge_alloc(total) : NULL;
    c->bank = malloc(n * sizeof(int32_t));
    c->expert = malloc(n * sizeof(int32_t));
    c->last_use = calloc(n, sizeof(uint64_t));
    c->hits = calloc(n, sizeof(uint64_t));
    c->pin = calloc(n, sizeof(uint32_t));
    c->slot_of = malloc(n * sizeof(int32_t));
    c->counts = calloc(n, sizeof(uint64_t));
    c->req = malloc(n * sizeof(int32_t));
    c->spec = calloc(n, 1);
    if ((n_slots && !c->mem) || !c->bank || !c->expert || !c->last_use || !c->hits || !c->pin || !c->slot_of || !c->counts ||
        !c->req || !c->spec) {
        we_free(c);
        return WASTE_E_NOMEM;
    }
    c->held_bytes = (n_slots ? total : 0) + n * (3 * sizeof(int32_t) + 2 * sizeof(uint64_t) + sizeof(uint32_t) + 1) +
                    n * (sizeof(int32_t) + sizeof(uint64_t));
    for (uint64_t i = 0; i < n; i++) { c->bank[i] = -1; c->expert[i] = -1; c->slot_of[i] = -1; c->req[i] = -1; }
    for (uint32_t i = 0; i < WE_REQS; i++) c->free_req[i] = (int32_t)(WE_REQS - 1 - i);
    c->n_free = WE_REQS;
    return WASTE_OK;
}

void we_free(we_cache *c) {
    free(c->mem); free(c->bank); free(c->expert); free(c->last_use); free(c->hits); free(c->pin);
    free(c->slot_of); free(c->counts); free(c->req); free(c->spec);
    memset(c, 0, sizeof *c);
}

void we_unpin_all(we_cache *c) {
    for (uint32_t i = 0; i < c->n_slots; i++) c->pin[i] = 0;
}

void we_unpin(we_cache *c, int32_t s) {
    if (s >= 0 && c->pin[s]) c->pin[s]--;
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

static int32_t pick_sampled(we_cache *c) {
    int32_t best = -1;
    for (int i = 0; i < 16; i++) {
        uint32_t s = (uint32_t)(next_rand(c) % c->n_slots);
        if (!c->pin[s] && c->bank[s] < 0) return (int32_t)s;
        if (!c->pin[s] && better_victim(c, s, best)) best = (int32_t)s;
    }
    if (best < 0)
        for (uint32_t s = 0; s < c->n_slots; s++)
            if (!c->pin[s] && better_victim(c, s, best)) best = (int32_t)s;
    return best;
}

/* LAYER: how far ahead in the layer cycle slot s can next be used, from the current bank:
 * bank cur+1 is next (0), the current bank itself is last (n_banks - 1). A selected expert of
 * the current bank is needed now: below everything (-1). */
static int64_t cycle_distance(const we_cache *c, uint32_t s) {
    uint32_t b = (uint32_t)c->bank[s];
    if (b == c->cur_bank && c->needed && c->needed[c->expert[s]]) return -1;
    return (int64_t)((b + 2 * c->n_banks - c->cur_bank - 1) % c->n_banks);
}

/* How many standard deviations (of a count read as a Poisson estimate) the coldest expert
 * anywhere must lie below LAYER's own victim before it is evicted instead: 2 keeps uniform
 * routing (where every difference in counts is noise) at LAYER's stable resident sets, and
 * lets skewed routing give a cold layer's slots to hot experts of other layers
 * (docs/ENGINE.md §5 Policy). */
#define WE_COLDER_Z 2

static int32_t pick_layer(we_cache *c) {
    int32_t best = -1, cold = -1;
    int64_t bd = 0, cd = 0;
    uint64_t bn = 0, cn = 0;
    for (uint32_t s = 0; s < c->n_slots; s++) {
        if (c->pin[s]) continue;
        if (c->bank[s] < 0) return (int32_t)s;   /* emptied (a guess taken back, a failed read) */
        int64_t d = cycle_distance(c, s);
        uint64_t n = c->counts[(uint64_t)c->bank[s] * c->n_experts + (uint32_t)c->expert[s]];
        if (best < 0 || d > bd || (d == bd && (n < bn || (n == bn && c->last_use[s] < c->last_use[best])))) {
            best = (int32_t)s; bd = d; bn = n;
        }
        if (cold < 0 || n < cn || (n == cn && (d > cd || (d == cd && c->last_use[s] < c->last_use[cold])))) {
            cold = (int32_t)s; cd = d; cn = n;
        }
    }
    /* Every forward pass walks every MoE layer once, so counts of different layers compare. */
    if (cold >= 0 && cn < bn) {
        double gap = (double)(bn - cn);
        if (gap * gap > (double)WE_COLDER_Z * WE_COLDER_Z * (double)bn) return cold;
    }
    return best;
}

static int32_t pick_slot(we_cache *c) {
    if (c->used < c->n_slots) return (int32_t)c->used++;
    return c->policy == WASTE_CACHE_LAYER ? pick_layer(c) : pick_sampled(c);
}

void we_begin_layer(we_cache *c, uint32_t bank, const uint8_t *needed) {
    c->cur_bank = bank;
    c->needed = needed;
}

/* ==== lookup ======================================================================= */
int32_t we_lookup(we_cache *c, uint32_t bank, uint32_t e, int32_t *victim) {
    uint64_t key = (uint64_t)bank * c->n_experts + e;
    c->tick++;
    /* docs/ENGINE.md §5 Counting: one access per call (per token in decode, per distinct expert
     * of a chunk in prefill). Saturating, so a merged hotlist can never wrap. */
    if (c->counts[key] != UINT64_MAX) c->counts[key]++;
    int32_t hit = c->slot_of[key];
    if (hit >= 0) {
        uint32_t s = (uint32_t)hit;
        c->hits[s]++; c->last_use[s] = c->tick; c->pin[s]++;
        return hit;
    }
    int32_t s = pick_slot(c);
    *victim = s;
    c->victim_guess_bank = -1;
    if (s >= 0 && c->spec[s]) { c->victim_guess_bank = c->bank[s]; c->spec[s] = 0; }
    if (s >= 0) {
        if (c->bank[s] >= 0) c->slot_of[(uint64_t)c->bank[s] * c->n_experts + (uint32_t)c->expert[s]] = -1;
        c->bank[s] = -1; c->expert[s] = -1;
    }
    return -1;
}

void we_install(we_cache *c, int32_t s, uint32_t bank, uint32_t e) {
    c->bank[s] = (int32_t)bank; c->expert[s] = (int32_t)e; c->slot_of[(uint64_t)bank * c->n_experts + e] = s;
    c->hits[s] = 1; c->last_use[s] = c->tick; c->pin[s] = 1;
}

/* ==== fetching: synchronous, or through the reader pool =========================== */
/* Every read counts in reads and bytes (speculative ones too); a miss is an access whose
 * record had to be read (a confirmed guess included). */
static void count_miss(waste_ctx *ctx) {
    ctx->call_misses++;
    atomic_fetch_add(&ctx->st_misses, 1);
}

static void count_read(waste_ctx *ctx, const wc_bank *b, double ms, int real) {
    atomic_fetch_add(&ctx->st_io_us, (uint64_t)(ms * 1000.0));
    atomic_fetch_add(&ctx->st_reads, 1);
    ctx->call_bytes += b->record_bytes;
    atomic_fetch_add(&ctx->st_bytes, b->record_bytes);
    if (real) count_miss(ctx);
}

/* Queues the read of (bank, e) into slot s (pinned, mapped); 0, or -1 when no request is free. */
static int submit(waste_ctx *ctx, int32_t s, uint32_t bank, uint32_t e) {
    we_cache *c = &ctx->cache;
    if (c->n_free == 0 || !ctx->io) return -1;
    int32_t q = c->free_req[--c->n_free];
    wi_req *r = &c->reqs[q];
    r->c = &ctx->c; r->b = &ctx->c.banks[bank]; r->e = e; r->verify = (int)ctx->verify;
    r->need = bank;   /* banks are the MoE layers in the order a forward pass needs them */
    r->dst = c->mem + (uint64_t)s * c->slot_bytes;
    c->req[s] = q;
    wi_submit(ctx->io, r);
    return 0;
}

/* Waits for slot s's read; frees its request; on failure unmaps the slot. Returns the status
 * (the detail in ctx->err). */
static int32_t finish(waste_ctx *ctx, int32_t s) {
    we_cache *c = &ctx->cache;
    int32_t q = c->req[s];
    if (q < 0) return WASTE_OK;
    wi_req *r = &c->reqs[q];
    double t0 = wu_now_ms();
    if (wi_wait(ctx->io, r)) {        /* the computing thread's stall */
        double dt = wu_now_ms() - t0;
        ctx->call_io_ms += dt;
        atomic_fetch_add(&ctx->st_wait_us, (uint64_t)(dt * 1000.0));
    }
    c->req[s] = -1;
    c->free_req[c->n_free++] = q;
    count_read(ctx, r->b, r->ms, !c->spec[s]);
    if (r->status) {
        if (!c->spec[s]) wx_err(ctx, "%s", r->err);
        c->slot_of[(uint64_t)c->bank[s] * c->n_experts + (uint32_t)c->expert[s]] = -1;
        c->bank[s] = -1; c->expert[s] = -1; c->spec[s] = 0;
        return r->status;
    }
    return WASTE_OK;
}

/* Lands every speculative read still pinned and releases its pin (the guesses stay cached
 * and counted as guesses); returns how many pins it released. A real miss that finds no
 * evictable slot calls it before giving up: a guess never costs a failure. */
static uint32_t reclaim_guesses(waste_ctx *ctx) {
    we_cache *c = &ctx->cache;
    uint32_t n = 0;
    for (uint32_t s = 0; s < c->n_slots; s++) {
        if (!c->spec[s] || c->req[s] < 0) continue;
        if (finish(ctx, (int32_t)s) == WASTE_OK && c->pin[s]) { c->pin[s]--; n++; }
        else c->pin[s] = 0;
    }
    return n;
}

int32_t we_fetch(waste_ctx *ctx, uint32_t bank, uint32_t e, int32_t *slot) {
    we_cache *c = &ctx->cache;
    const wc_bank *b = &ctx->c.banks[bank];
    int32_t s;
    int32_t hit = we_lookup(c, bank, e, &s);
    if (hit >= 0) {
        *slot = hit;
        if (c->spec[hit]) {
            /* A guess the router confirmed: its read (landed or not, we_ready finishes it)
             * becomes this access's miss, and its pin this access's pin. */
            atomic_fetch_add(&ctx->st_guess_hits, 1);
            c->hits[hit]--; c->spec[hit] = 0;
            if (c->req[hit] >= 0) c->pin[hit]--;   /* we_ready lands it and counts the miss */
            else count_miss(ctx);                  /* landed and released by reclaim_guesses */
            return WASTE_OK;
        }
        ctx->call_hits++; atomic_fetch_add(&ctx->st_hits, 1);
        return WASTE_OK;
    }
    if (s < 0 && reclaim_guesses(ctx)) {
        c->tick--; if (c->counts[(uint64_t)bank * c->n_experts + e]) c->counts[(uint64_t)bank * c->n_experts + e]--;
        return we_fetch(ctx, bank, e, slot);   /* once more, with the guesses' slots evictable */
    }
    *slot = s;
    if (c->victim_guess_bank >= 0) atomic_fetch_add(&ctx->st_wasted_bytes, ctx->c.banks[c->victim_guess_bank].record_bytes);
    if (s < 0) {
        wx_err(ctx, "no evictable expert slot for expert %u of layer %u (%u slots, all pinned)", e, b->layer, c->n_slots);
        return WASTE_E_BUDGET;
    }
    we_install(c, s, bank, e);
    if (ctx->io && submit(ctx, s, bank, e) == 0) return WASTE_OK;
    double t0 = wu_now_ms();
    int32_t st = wc_read_record(&ctx->c, b, e, c->mem + (uint64_t)s * c->slot_bytes, (int)ctx->verify, ctx->err,
                                sizeof ctx->err);
    double dt = wu_now_ms() - t0;
    ctx->call_io_ms += dt;
    atomic_fetch_add(&ctx->st_wait_us, (uint64_t)(dt * 1000.0));
    count_read(ctx, b, dt, 1);
    if (st) {
        c->slot_of[(uint64_t)bank * c->n_experts + e] = -1;
        c->bank[s] = -1; c->expert[s] = -1;
        return st;
    }
    return WASTE_OK;
}

int32_t we_ready(waste_ctx *ctx, int32_t s, const uint8_t **rec) {
    we_cache *c = &ctx->cache;
    int32_t st = finish(ctx, s);
    if (st) return st;
    *rec = c->mem + (uint64_t)s * c->slot_bytes;
    return WASTE_OK;
}

int we_landed(const waste_ctx *ctx, int32_t s) {
    const we_cache *c = &ctx->cache;
    return c->req[s] < 0 || wi_is_done(ctx->io, &c->reqs[c->req[s]]);
}

void we_speculate(waste_ctx *ctx, uint32_t bank, uint32_t e) {
    we_cache *c = &ctx->cache;
    uint64_t key = (uint64_t)bank * c->n_experts + e;
    if (!ctx->io || c->slot_of[key] >= 0 || c->n_free == 0) return;
    int32_t s = pick_slot(c);
    if (s < 0) return;                /* nothing evictable: a guess is never worth a failure */
    if (c->spec[s]) atomic_fetch_add(&ctx->st_wasted_bytes, ctx->c.banks[c->bank[s]].record_bytes);
    if (c->bank[s] >= 0) c->slot_of[(uint64_t)c->bank[s] * c->n_experts + (uint32_t)c->expert[s]] = -1;
    c->bank[s] = (int32_t)bank; c->expert[s] = (int32_t)e; c->slot_of[key] = s;
    c->hits[s] = 1; c->last_use[s] = c->tick; c->pin[s] = 1; c->spec[s] = WE_SPEC_GUESS;
    if (submit(ctx, s, bank, e) != 0) {   /* cannot happen (n_free checked); undo */
        c->slot_of[key] = -1; c->bank[s] = -1; c->expert[s] = -1; c->pin[s] = 0; c->spec[s] = 0;
        return;
    }
    atomic_fetch_add(&ctx->st_guesses, 1);
}

/* An unconfirmed guess: its read is finished (at once when it has landed; at the pass's end,
 * we_land_guesses, waiting for it), its pin goes and its bytes count as wasted (the record
 * stays cached). */
static void guess_wasted(waste_ctx *ctx, int32_t s) {
    we_cache *c = &ctx->cache;
    const wc_bank *b = &ctx->c.banks[c->bank[s]];
    if (c->req[s] >= 0) {
        if (finish(ctx, s) != WASTE_OK) { c->pin[s] = 0; c->spec[s] = 0; return; }
        if (c->pin[s]) c->pin[s]--;
    }
    c->spec[s] = 0;
    atomic_fetch_add(&ctx->st_wasted_bytes, b->record_bytes);
}

/* A guess no reader has started is taken back: never read, its slot empty and unpinned, and
 * it no longer counts as a guess. */
static int guess_cancelled(waste_ctx *ctx, int32_t s) {
    we_cache *c = &ctx->cache;
    int32_t q = c->req[s];
    if (q < 0 || !wi_cancel(ctx->io, &c->reqs[q])) return 0;
    c->req[s] = -1;
    c->free_req[c->n_free++] = q;
    c->slot_of[(uint64_t)c->bank[s] * c->n_experts + (uint32_t)c->expert[s]] = -1;
    c->bank[s] = -1; c->expert[s] = -1; c->pin[s] = 0; c->spec[s] = 0;
    atomic_fetch_sub(&ctx->st_guesses, 1);
    return 1;
}

void we_settle_guesses(waste_ctx *ctx, uint32_t bank) {
    we_cache *c = &ctx->cache;
    for (uint32_t i = 0; i < c->n_slots; i++) {
        int32_t s = (int32_t)i;
        if (c->spec[s] == WE_SPEC_LEFT && we_landed(ctx, s)) { guess_wasted(ctx, s); continue; }
        if (c->spec[s] != WE_SPEC_GUESS || c->bank[s] != (int32_t)bank) continue;
        /* Never used by the token it was guessed for: taken back if still queued, released if
         * landed, else left to land while pinned (released by a later layer's settling or at the
         * pass's end by we_land_guesses). */
        if (guess_cancelled(ctx, s)) continue;
        if (we_landed(ctx, s)) guess_wasted(ctx, s);
        else c->spec[s] = WE_SPEC_LEFT;
    }
}

void we_land_guesses(waste_ctx *ctx) {
    we_cache *c = &ctx->cache;
    for (uint32_t s = 0; s < c->n_slots; s++)
        if (c->spec[s] == WE_SPEC_LEFT) guess_wasted(ctx, (int32_t)s);
}

void we_drain(waste_ctx *ctx) {
    we_cache *c = &ctx->cache;
    for (uint32_t s = 0; s < c->n_slots; s++) {
        if (c->req[s] >= 0) {
            int spec = c->spec[s];
            c->spec[s] = 1;           /* a drained read reports nothing: the call already failed */
            finish(ctx, (int32_t)s);
            c->spec[s] = (uint8_t)spec;
        }
        c->pin[s] = 0;
    }
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
        /* The hotlist never fails open (docs/FORMAT.md §8): a damaged record is skipped with a
         * note, and the call that first needs it fails naming it, as it would unwarmed. */
        st = wc_read_record(&ctx->c, b, e, c->mem + (uint64_t)s * c->slot_bytes, (int)ctx->verify, err, cap);
        if (st == WASTE_E_FORMAT || st == WASTE_E_IO) {
            if (!ctx->usage_note[0])
                snprintf(ctx->usage_note, sizeof ctx->usage_note, "not warmed: %.140s", err);
            err[0] = 0;
            st = WASTE_OK;
            continue;
        }
        if (st) break;
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
