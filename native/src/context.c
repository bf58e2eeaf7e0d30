/* context.c — the context utilities of context.h: error detail, memory accounting, the
 * busy guard and status names. The lowest layer on a waste_ctx: it calls only util.c. */
#include <stdarg.h>
#include <stdio.h>

#include "context.h"
#include "engine.h"

void wx_err(waste_ctx *ctx, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    wu_vformat(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
}

/* ==== memory accounting ============================================================ */
void wx_mem_add(waste_ctx *ctx, uint64_t bytes) {
    uint64_t now = atomic_fetch_add(&ctx->mem_now, bytes) + bytes;
    uint64_t peak = atomic_load(&ctx->mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&ctx->mem_peak, &peak, now)) {}
}

void wx_mem_sub(waste_ctx *ctx, uint64_t bytes) { atomic_fetch_sub(&ctx->mem_now, bytes); }

/* ==== busy guard =================================================================== */
int32_t wx_enter(waste_ctx *ctx) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&ctx->busy, &expected, 1)) {
        /* Do not touch ctx->err: the running call owns it. */
        return WASTE_E_BUSY;
    }
    ctx->err[0] = 0;
    return WASTE_OK;
}

int32_t wx_leave(waste_ctx *ctx, int32_t st) { atomic_store(&ctx->busy, 0); return st; }

int wx_claim(waste_ctx *ctx) {
    int expected = 0;
    return atomic_compare_exchange_strong(&ctx->busy, &expected, 1);
}

int wx_is_busy(waste_ctx *ctx) { return atomic_load(&ctx->busy) != 0; }

int32_t wx_refuse_any_thread(waste_ctx *ctx, const char *what) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&ctx->busy, &expected, 1)) {
        snprintf(ctx->err, sizeof ctx->err, "%s", what);
        atomic_store(&ctx->busy, 0);
    }
    return WASTE_E_ARG;
}

const char *wx_status_name(int32_t s) {
    switch (s) {
    case WASTE_OK: return "OK"; case WASTE_E_IO: return "E_IO"; case WASTE_E_FORMAT: return "E_FORMAT";
    case WASTE_E_BUDGET: return "E_BUDGET"; case WASTE_E_NOMEM: return "E_NOMEM"; case WASTE_E_ARG: return "E_ARG";
    case WASTE_E_UNSUPPORTED: return "E_UNSUPPORTED"; case WASTE_E_CANCELLED: return "E_CANCELLED";
    case WASTE_E_BUSY: return "E_BUSY"; case WASTE_E_STATE: return "E_STATE"; case WASTE_E_SPACE: return "E_SPACE";
    case WASTE_E_CTX: return "E_CTX"; default: return "E_UNKNOWN";
    }
}
