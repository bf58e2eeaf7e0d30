/* open.h — building and tearing down a context (open.c): the memory plan from a manifest,
 * open in its fixed order (manifest, lock, tokenizer, sizing, data, bind, state, expert
 * slots, hotlist, threads) and the matching free. Not public; api.c has checked cfg. */
#ifndef WASTE_OPEN_H
#define WASTE_OPEN_H

#include "internal.h"

/* Fills plan from the manifest at path alone (no bank I/O). */
int32_t wo_plan(const char *path, const waste_cfg *cfg, waste_plan *plan, char *err, uint64_t cap);
/* Opens the container at path; on failure frees what it built and leaves *out alone. */
int32_t wo_open(const char *path, const waste_cfg *cfg, waste_ctx **out, char *err, uint64_t cap);
/* Frees everything a ctx holds (NULL is fine). */
void wo_free(waste_ctx *ctx);

#endif
