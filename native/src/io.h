/* io.h — the reader pool (io.c): record reads in flight on n threads. Internal. */
#ifndef WASTE_IO_H
#define WASTE_IO_H

#include "internal.h"

enum { WI_IDLE = 0, WI_QUEUED = 1, WI_READING = 2, WI_DONE = 3 };

/* One record read. The caller fills c, b, e, dst, verify and need, owns the request and keeps
 * dst (a pinned slot) untouched until wi_wait returns; status and err are the read's. */
typedef struct wi_req {
    const wc_container *c;
    const wc_bank *b;
    uint32_t e;
    int verify;
    uint8_t *dst;
    uint32_t need;                  /* when it is needed: the MoE layer (bank) it is read for */
    int32_t status;
    int state;                      /* WI_*; changed under the pool's lock */
    double ms;                      /* how long the read took */
    struct wi_req *next;
    char err[512];
} wi_req;

typedef struct wi_pool wi_pool;

/* What a reader does with a request: read == NULL is container.c's record read and check
 * (wc_read_record into r->dst); tests pass their own. Returns the status; fills r->err. */
typedef int32_t (*wi_read_fn)(wi_req *r);

/* Reads are started in the order they are needed: a free reader takes the queued request of
 * the lowest `need` (the oldest among equals), and starts none whose `need` is above that of a
 * read already in flight. So reads of one layer run side by side, and a guess for a later
 * layer never shares the disk with a record the computing thread is waiting for
 * (docs/ENGINE.md §5 Reading ahead). */
int32_t wi_open(uint32_t n_threads, wi_read_fn read, wi_pool **out);
/* Finishes every queued read, joins the threads, frees; NULL-safe. */
void wi_close(wi_pool *p);
void wi_submit(wi_pool *p, wi_req *r);
/* Takes r back if no reader has started it (returns 1: it is off the queue, never read, and
 * idle again); 0 when it is being read or done. */
int wi_cancel(wi_pool *p, wi_req *r);
/* Blocks until r is done; returns whether it had to wait. */
int wi_wait(wi_pool *p, wi_req *r);
int wi_is_done(wi_pool *p, const wi_req *r);
/* The deepest queue reached, the time >= 1 read was in flight, and the sum of read times. */
void wi_stats(wi_pool *p, uint32_t *depth_max, uint64_t *busy_us, uint64_t *read_us);

#endif
