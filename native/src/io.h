/* io.h — the reader pool (io.c): record reads in flight on n threads. Internal. */
#ifndef WASTE_IO_H
#define WASTE_IO_H

#include "internal.h"

enum { WI_IDLE = 0, WI_QUEUED = 1, WI_DONE = 2 };

/* One record read. The caller fills c, b, e, dst, verify, owns the request and keeps dst
 * (a pinned slot) untouched until wi_wait returns; status and err are the read's. */
typedef struct wi_req {
    const wc_container *c;
    const wc_bank *b;
    uint32_t e;
    int verify;
    uint8_t *dst;
    int32_t status;
    int state;                      /* WI_*; changed under the pool's lock */
    double ms;                      /* how long the read took */
    struct wi_req *next;
    char err[512];
} wi_req;

typedef struct wi_pool wi_pool;

int32_t wi_open(uint32_t n_threads, wi_pool **out);
/* Finishes every queued read, joins the threads, frees; NULL-safe. */
void wi_close(wi_pool *p);
void wi_submit(wi_pool *p, wi_req *r);
/* Blocks until r is done; returns whether it had to wait. */
int wi_wait(wi_pool *p, wi_req *r);
int wi_is_done(wi_pool *p, const wi_req *r);
/* Whether a reader is free: fewer reads queued or in flight than readers. */
int wi_idle(wi_pool *p);
/* The deepest queue reached, the time >= 1 read was in flight, and the sum of read times. */
void wi_stats(wi_pool *p, uint32_t *depth_max, uint64_t *busy_us, uint64_t *read_us);

#endif
