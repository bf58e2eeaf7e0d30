/* context.h — the context utilities every component on a waste_ctx may use (context.c):
 * the per-context error detail, memory accounting, the busy guard and status names.
 * Not public. Components include this instead of reaching into api.c or waste.h's
 * functions; see native/README.md for who may call whom. */
#ifndef WASTE_CONTEXT_H
#define WASTE_CONTEXT_H

#include "internal.h"

/* Formats the detail of the running call into ctx->err (the caller holds the busy flag). */
void wx_err(waste_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Memory accounting: every engine allocation that scales with the model. Only the thread
 * holding the busy flag changes the counters; waste_get_stats reads them from any thread. */
void wx_mem_add(waste_ctx *ctx, uint64_t bytes);
void wx_mem_sub(waste_ctx *ctx, uint64_t bytes);

/* The busy guard (docs/ENGINE.md §1): one call at a time per context. wx_enter takes the
 * flag and clears the detail, or returns WASTE_E_BUSY leaving the detail to the running
 * call; wx_leave drops the flag and passes st through. */
int32_t wx_enter(waste_ctx *ctx);
int32_t wx_leave(waste_ctx *ctx, int32_t st);
/* Takes the flag for good (close): 1 when taken, 0 when a call is running. */
int wx_claim(waste_ctx *ctx);
int wx_is_busy(waste_ctx *ctx);
/* For the calls allowed from any thread: records what as the detail only when no call is
 * running (a running call owns ctx->err); returns WASTE_E_ARG. */
int32_t wx_refuse_any_thread(waste_ctx *ctx, const char *what);

/* The name of a status ("E_IO"), "E_UNKNOWN" for any other value. */
const char *wx_status_name(int32_t st);

/* Public entry points: NULL ctx is E_ARG, a running call E_BUSY, else the flag is held. */
#define WX_ENTER(ctx) do { if (!(ctx)) return WASTE_E_ARG; int32_t e_ = wx_enter(ctx); if (e_) return e_; } while (0)

#endif
