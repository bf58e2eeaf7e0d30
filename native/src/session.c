/* session.c — the generation session of session.h: chunked prefill (an abort is honoured
 * before each chunk), the generate loop (sample, deliver the piece, evaluate) and the
 * UTF-8 hold-back that keeps a piece from ending inside a character (docs/ENGINE.md §2).
 * A failure that leaves the state unknown poisons the ctx (§1). */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "engine.h"
#include "session.h"
#include "sysinfo.h"
#include "tokenizer.h"

/* ==== evaluation =================================================================== */
/* docs/ENGINE.md §1 (E_IO, E_FORMAT, E_NOMEM) and §5 (E_BUDGET: no evictable slot). */
static int is_poisoning(int32_t st) {
    return st == WASTE_E_IO || st == WASTE_E_FORMAT || st == WASTE_E_NOMEM || st == WASTE_E_BUDGET;
}

/* Evaluates ids in chunks; an abort is honoured before each chunk. */
static int32_t run_chunks(waste_ctx *ctx, const int32_t *ids, uint64_t n, uint64_t *done) {
    *done = 0;
    while (*done < n) {
        if (atomic_exchange(&ctx->abort_flag, 0)) { wx_err(ctx, "aborted by waste_abort"); return WASTE_E_CANCELLED; }
        uint64_t m = n - *done < ctx->prefill_chunk ? n - *done : ctx->prefill_chunk;
        int32_t st = wm_forward(ctx, ids + *done, (uint32_t)m, *done + m == n);
        if (st) {
            if (is_poisoning(st)) ctx->poisoned = 1;
            if (!ctx->err[0]) wx_err(ctx, "evaluation failed (%s)", wx_status_name(st));
            return st;
        }
        *done += m;
    }
    return WASTE_OK;
}

static void reset_call_counters(waste_ctx *ctx) {
    ctx->call_hits = ctx->call_misses = ctx->call_bytes = 0; ctx->call_io_ms = 0;
}

int32_t wg_eval(waste_ctx *ctx, const int32_t *ids, uint64_t n, float *logits) {
    reset_call_counters(ctx);
    uint64_t done;
    wsys_pin pin; wsys_pin_caller(ctx->cpus, &pin);
    int32_t st = run_chunks(ctx, ids, n, &done);
    wsys_unpin_caller(&pin);
    if (st) return st;
    if (logits) memcpy(logits, ctx->logits, (size_t)ctx->c.cfg.vocab * sizeof(float));
    return WASTE_OK;
}

/* ==== pieces: UTF-8 hold-back ====================================================== */
typedef struct { uint8_t hold[4]; uint32_t n_hold; uint8_t *buf; uint64_t cap; } piece_state;

/* Length of a valid-but-incomplete UTF-8 sequence at the end of p[0..n), else 0. */
static uint32_t incomplete_tail(const uint8_t *p, uint64_t n) {
    for (uint32_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t b = p[n - back];
        if ((b & 0xC0) == 0x80) continue;
        uint32_t need = (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
        if (need <= back) return 0;
        if (back >= 2) {
            uint8_t c = p[n - back + 1];
            uint8_t lo = 0x80, hi = 0xBF;
            if (b == 0xE0) lo = 0xA0; else if (b == 0xED) hi = 0x9F; else if (b == 0xF0) lo = 0x90; else if (b == 0xF4) hi = 0x8F;
            if (c < lo || c > hi) return 0;
        }
        return back;
    }
    return 0;
}

static int32_t make_piece(waste_ctx *ctx, piece_state *ps, int32_t tok, int flush, const char **out, uint32_t *out_len) {
    *out = ""; *out_len = 0;
    if (!ctx->tok) return WASTE_OK;
    const uint8_t *b; uint64_t bl;
    /* An id the model can sample but the tokenizer has no text for (a padding row of the
     * embedding, or a gap between special ids) has an empty piece, as detokenize refuses it;
     * waste.h documents this at waste_token_info.piece. */
    if (wt_token_bytes(ctx->tok, tok, &b, &bl) != 0) { b = (const uint8_t *)""; bl = 0; }
    uint64_t need = ps->n_hold + bl + 1;
    if (need > ps->cap) {
        uint8_t *nb = realloc(ps->buf, need);
        if (!nb) return WASTE_E_NOMEM;
        wx_mem_add(ctx, need - ps->cap);
        ps->buf = nb; ps->cap = need;
    }
    memcpy(ps->buf, ps->hold, ps->n_hold);
    memcpy(ps->buf + ps->n_hold, b, bl);
    uint64_t n = ps->n_hold + bl;
    int special = ctx->tok && (uint32_t)tok >= wt_n_base_vocab(ctx->tok);
    uint32_t keep = (flush || special) ? 0 : incomplete_tail(ps->buf, n);
    memcpy(ps->hold, ps->buf + n - keep, keep);
    ps->n_hold = keep;
    ps->buf[n - keep] = 0;
    *out = (const char *)ps->buf; *out_len = (uint32_t)(n - keep);
    return WASTE_OK;
}

/* ==== generation =================================================================== */
int32_t wg_generate(waste_ctx *ctx, const int32_t *prompt, uint64_t n, const waste_gen_params *params,
                    waste_token_cb cb, void *user, waste_gen_result *res) {
    waste_gen_result r; memset(&r, 0, sizeof r); r.struct_size = sizeof r;
    /* lookahead counters of this call: the ctx-wide ones now and at the end (one call at a time) */
    uint64_t guesses0 = atomic_load(&ctx->st_guesses), guess_hits0 = atomic_load(&ctx->st_guess_hits);
    uint64_t wasted0 = atomic_load(&ctx->st_wasted_bytes);
    r.direct_io = ctx->direct_all;
    piece_state ps; memset(&ps, 0, sizeof ps);
    ws_rng rng; ws_seed(&rng, params->seed);
    reset_call_counters(ctx);
    double t0 = wu_now_ms();
    uint64_t done = 0;
    wsys_pin pin; wsys_pin_caller(ctx->cpus, &pin);
    int32_t st = run_chunks(ctx, prompt, n, &done);
    r.prompt_tokens = (uint32_t)done;
    r.prefill_ms = wu_now_ms() - t0;
    double pass_start = t0;
    /* Logit processing state (docs/ENGINE.md §2 Logit processing): per call, only when asked. */
    uint32_t vocab = ctx->c.cfg.vocab, n_words = (vocab + 31) / 32;
    int penalties = params->presence_penalty != 0.0f || params->frequency_penalty != 0.0f ||
                    params->repetition_penalty != 1.0f;
    uint32_t *counts = NULL, *allowed = NULL;
    uint8_t *seen = NULL;
    uint64_t extra = 0;
    if (st == WASTE_OK && penalties) {
        counts = calloc(vocab, sizeof *counts);
        seen = params->repetition_penalty != 1.0f ? calloc(vocab, 1) : NULL;
        extra += (uint64_t)vocab * sizeof *counts + (seen ? vocab : 0);
        if (!counts || (params->repetition_penalty != 1.0f && !seen)) {
            wx_err(ctx, "out of memory for the penalty counts (%u ids)", vocab); st = WASTE_E_NOMEM;
        } else if (seen) {
            for (uint64_t i = 0; i < ctx->pos; i++) seen[ctx->ids[i]] = 1;
        }
    }
    if (st == WASTE_OK && params->mask_cb) {
        allowed = malloc((uint64_t)n_words * sizeof *allowed);
        extra += (uint64_t)n_words * sizeof *allowed;
        if (!allowed) { wx_err(ctx, "out of memory for the token mask (%u words)", n_words); st = WASTE_E_NOMEM; }
    }
    wx_mem_add(ctx, extra);
    int32_t top_ids[WASTE_MAX_TOP_LOGPROBS];
    float top_lps[WASTE_MAX_TOP_LOGPROBS];
    for (uint32_t idx = 0; st == WASTE_OK; idx++) {
        float lp;
        if (allowed) {
            memset(allowed, 0xFF, (uint64_t)n_words * sizeof *allowed);
            if (vocab % 32) allowed[n_words - 1] = (1u << (vocab % 32)) - 1u;
            if (params->mask_cb(idx, allowed, n_words, params->mask_user)) { r.stop_reason = WASTE_STOP_CALLBACK; break; }
            if (vocab % 32) allowed[n_words - 1] &= (1u << (vocab % 32)) - 1u;   /* no id >= vocab */
            uint32_t any = 0;
            for (uint32_t w = 0; w < n_words; w++) any |= allowed[w];
            if (!any) { wx_err(ctx, "the mask allows no token (token %u)", idx); st = WASTE_E_ARG; break; }
        }
        if (params->n_logit_bias || counts || allowed)
            ws_adjust(ctx->logits, vocab, params, counts, seen, allowed);
        int32_t tok = ws_sample(ctx->sample_pairs, ctx->logits, vocab, params, &rng, &lp);
        if (counts) counts[tok]++;
        uint32_t n_top = ws_top(ctx->logits, vocab, params->n_top_logprobs, top_ids, top_lps);
        int is_stop = 0;
        for (uint32_t i = 0; i < params->n_stop_ids; i++) if (params->stop_ids[i] == tok) is_stop = 1;
        int max_hit = params->max_tokens && idx + 1 >= params->max_tokens;
        int ctx_full = ctx->pos + 1 > ctx->ctx_tokens;
        waste_token_info info; memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        info.index = idx; info.token = tok; info.is_stop = is_stop; info.logprob = lp;
        info.experts_hit = (uint32_t)ctx->call_hits; info.experts_missed = (uint32_t)ctx->call_misses;
        info.bytes_read = ctx->call_bytes; info.io_ms = ctx->call_io_ms;
        info.ms = wu_now_ms() - pass_start;
        r.experts_hit += ctx->call_hits; r.experts_missed += ctx->call_misses; r.bytes_read += ctx->call_bytes;
        reset_call_counters(ctx);
        const char *piece; uint32_t plen;
        if (make_piece(ctx, &ps, tok, is_stop || max_hit || ctx_full, &piece, &plen)) {
            wx_err(ctx, "out of memory for the piece of generated token %u", idx);
            st = WASTE_E_NOMEM; ctx->poisoned = 1; break;
        }
        info.piece = piece; info.piece_len = plen;
        info.n_top = n_top; info.top_ids = top_ids; info.top_logprobs = top_lps;
        int32_t stop_cb = cb ? cb(&info, user) : 0;
        r.tokens_generated = idx + 1;
        if (is_stop) { r.stop_reason = WASTE_STOP_TOKEN; break; }
        if (stop_cb) { r.stop_reason = WASTE_STOP_CALLBACK; break; }
        if (max_hit) { r.stop_reason = WASTE_STOP_MAX_TOKENS; break; }
        if (ctx_full) { r.stop_reason = WASTE_STOP_CTX_FULL; break; }
        if (atomic_exchange(&ctx->abort_flag, 0)) { wx_err(ctx, "aborted by waste_abort"); st = WASTE_E_CANCELLED; break; }
        pass_start = wu_now_ms();
        st = wm_forward(ctx, &tok, 1, 1);
        if (st) {
            if (is_poisoning(st)) ctx->poisoned = 1;
            if (!ctx->err[0]) wx_err(ctx, "evaluation failed (%s)", wx_status_name(st));
        }
    }
    wsys_unpin_caller(&pin);
    free(counts); free(seen); free(allowed);
    wx_mem_sub(ctx, extra);
    /* Bytes still held (no final flush: callback stop, abort, error) go to the result. */
    memcpy(r.tail, ps.hold, ps.n_hold);
    r.tail_len = ps.n_hold;
    free(ps.buf);
    wx_mem_sub(ctx, ps.cap);
    r.decode_ms = wu_now_ms() - t0 - r.prefill_ms;
    r.guesses = atomic_load(&ctx->st_guesses) - guesses0;
    r.guess_hits = atomic_load(&ctx->st_guess_hits) - guess_hits0;
    r.wasted_bytes = atomic_load(&ctx->st_wasted_bytes) - wasted0;
    if (res) *res = r;
    return st;
}
