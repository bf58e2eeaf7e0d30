/* snapshot.h — the conversation state as bytes (snapshot.c, docs/FORMAT.md §7): token
 * ids, MLA latents, KDA conv taps and recurrent state, with a crc32. Not public. The
 * caller (api.c) holds the busy flag and has refused tokenizer-only and poisoned ctxs. */
#ifndef WASTE_SNAPSHOT_H
#define WASTE_SNAPSHOT_H

#include "internal.h"

/* Bytes of a snapshot at the current position. */
uint64_t wsnap_size(const waste_ctx *ctx);
/* Writes the snapshot to buf; *n_out = its size, also when cap is too small (E_SPACE). */
int32_t wsnap_save(waste_ctx *ctx, void *buf, uint64_t cap, uint64_t *n_out);
/* Validates buf whole (magic, version, model, size, crc, ids) before it restores anything:
 * a refused snapshot leaves the state as it was. */
int32_t wsnap_load(waste_ctx *ctx, const void *buf, uint64_t len);

/* Segments (docs/FORMAT.md §7.1): positions since the ctx's anchor (or all, `whole`). */
void wsnap_segment_size(const waste_ctx *ctx, int32_t whole, uint64_t *size, uint64_t *base);
/* Writes the segment and makes it the anchor; *n_out = its size, also on E_SPACE. */
int32_t wsnap_segment_save(waste_ctx *ctx, int32_t whole, void *buf, uint64_t cap, uint64_t *n_out);
/* Validates every segment and the links between them before it restores anything; the
 * last segment becomes the anchor. n >= 1, segs and lens non-NULL (api.c checks). */
int32_t wsnap_chain_load(waste_ctx *ctx, const void *const *segs, const uint64_t *lens, uint32_t n);

#endif
