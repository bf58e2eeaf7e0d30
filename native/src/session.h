/* session.h — evaluation and generation on an open context (session.c): chunked prefill,
 * the sample → deliver → evaluate loop and the UTF-8 hold-back of token pieces
 * (docs/ENGINE.md §2). Not public. The caller (api.c) holds the busy flag and has checked
 * the arguments: ids in the vocabulary, fitting ctx_tokens, the ctx not poisoned. */
#ifndef WASTE_SESSION_H
#define WASTE_SESSION_H

#include "internal.h"

/* Evaluates ids[0..n) at ctx->pos; copies the last token's logits (vocab floats) to
 * logits when it is not NULL. */
int32_t wg_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n, float *logits);
/* Prefills prompt[0..n), then samples, delivers through cb and evaluates tokens until a
 * stop; *res (when not NULL) gets the result, also on failure. */
int32_t wg_generate(waste_ctx *ctx, const int32_t *prompt, uint64_t n, const waste_gen_params *params,
                    waste_token_cb cb, void *user, waste_gen_result *res);

#endif
