/* io.c — the reader pool behind cfg.io_threads (docs/ENGINE.md §5 Reads): n threads that
 * each take one queued record read at a time, so up to n reads are in flight at once (the
 * disk's faster queue depths). A request names its bank, expert, destination (a slot the
 * caller has pinned, so nothing else writes or evicts it while it is read) and when it is
 * needed; readers start requests in that order (io.h, wi_open), run container.c's one-pread
 * read and check and mark them done. The pool measures the deepest queue it reached and the
 * time at least one read was in flight (disk busy). Reader threads are unpinned. Knows
 * nothing of waste_ctx; the caller owns every request. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

typedef struct {
    wi_pool *p;
    uint32_t need;                  /* the `need` of the read this reader is doing, or UINT32_MAX */
} wi_reader;

struct wi_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    wi_req *head, *tail;            /* queued, in submission order */
    wi_read_fn read;
    int stop;
    uint32_t n_threads, started;
    uint32_t in_flight, depth_max;  /* queued + being read */
    double busy_since;              /* when in_flight last went 0 -> 1 */
    uint64_t busy_us, read_us;
    wi_reader *readers;             /* [n_threads] */
    pthread_t th[];
};

static int32_t read_record(wi_req *r) {
    return wc_read_record(r->c, r->b, r->e, r->dst, r->verify, r->err, sizeof r->err);
}

/* Unlinks and returns the queued request a free reader starts now (the lowest `need`, the
 * oldest among equals, and none above a read in flight), or NULL. Under the lock. */
static wi_req *take(wi_pool *p) {
    wi_req *best = NULL, *best_prev = NULL;
    for (wi_req *r = p->head, *prev = NULL; r; prev = r, r = r->next)
        if (!best || r->need < best->need) { best = r; best_prev = prev; }
    if (!best) return NULL;
    for (uint32_t i = 0; i < p->n_threads; i++)
        if (p->readers[i].need < best->need) return NULL;
    if (best_prev) best_prev->next = best->next; else p->head = best->next;
    if (p->tail == best) p->tail = best_prev;
    return best;
}

static void *reader(void *arg) {
    wi_reader *me = arg;
    wi_pool *p = me->p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        wi_req *r;
        /* A queued request that cannot start waits for a read in flight, which wakes us. */
        while (!(r = take(p)) && !(p->stop && !p->head)) pthread_cond_wait(&p->work, &p->mu);
        if (!r) break;              /* stop, and nothing left to read */
        me->need = r->need;
        r->state = WI_READING;
        pthread_mutex_unlock(&p->mu);
        double t0 = wu_now_ms();
        int32_t st = p->read(r);
        double dt = wu_now_ms() - t0;
        pthread_mutex_lock(&p->mu);
        me->need = UINT32_MAX;
        r->status = st;
        r->ms = dt;
        r->state = WI_DONE;
        p->read_us += (uint64_t)(dt * 1000.0);
        if (--p->in_flight == 0) p->busy_us += (uint64_t)((wu_now_ms() - p->busy_since) * 1000.0);
        pthread_cond_broadcast(&p->done);
        if (p->head) pthread_cond_broadcast(&p->work);   /* later reads this one held back */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int32_t wi_open(uint32_t n_threads, wi_read_fn read, wi_pool **out) {
    *out = NULL;
    wi_pool *p = calloc(1, sizeof *p + n_threads * sizeof(pthread_t));
    if (!p) return WASTE_E_NOMEM;
    p->readers = calloc(n_threads ? n_threads : 1, sizeof *p->readers);
    if (!p->readers) { free(p); return WASTE_E_NOMEM; }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->read = read ? read : read_record;
    p->n_threads = n_threads;
    for (uint32_t i = 0; i < n_threads; i++) p->readers[i] = (wi_reader){p, UINT32_MAX};
    for (uint32_t i = 0; i < n_threads; i++) {
        if (pthread_create(&p->th[i], NULL, reader, &p->readers[i]) != 0) { wi_close(p); return WASTE_E_NOMEM; }
        p->started++;
    }
    *out = p;
    return WASTE_OK;
}

void wi_close(wi_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;                    /* the readers finish what is queued, then leave */
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->started; i++) pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->readers);
    free(p);
}

void wi_submit(wi_pool *p, wi_req *r) {
    pthread_mutex_lock(&p->mu);
    r->state = WI_QUEUED;
    r->next = NULL;
    r->status = WASTE_OK;
    r->err[0] = 0;
    if (p->tail) p->tail->next = r; else p->head = r;
    p->tail = r;
    if (p->in_flight++ == 0) p->busy_since = wu_now_ms();
    if (p->in_flight > p->depth_max) p->depth_max = p->in_flight;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

int wi_cancel(wi_pool *p, wi_req *r) {
    pthread_mutex_lock(&p->mu);
    int taken = 0;
    if (r->state == WI_QUEUED) {
        for (wi_req *q = p->head, *prev = NULL; q; prev = q, q = q->next) {
            if (q != r) continue;
            if (prev) prev->next = r->next; else p->head = r->next;
            if (p->tail == r) p->tail = prev;
            break;
        }
        r->state = WI_IDLE;
        r->next = NULL;
        if (--p->in_flight == 0) p->busy_us += (uint64_t)((wu_now_ms() - p->busy_since) * 1000.0);
        taken = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return taken;
}

int wi_wait(wi_pool *p, wi_req *r) {
    pthread_mutex_lock(&p->mu);
    int waited = r->state != WI_DONE;
    while (r->state != WI_DONE) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return waited;
}

int wi_is_done(wi_pool *p, const wi_req *r) {
    pthread_mutex_lock(&p->mu);
    int d = r->state == WI_DONE;
    pthread_mutex_unlock(&p->mu);
    return d;
}

void wi_stats(wi_pool *p, uint32_t *depth_max, uint64_t *busy_us, uint64_t *read_us) {
    pthread_mutex_lock(&p->mu);
    *depth_max = p->depth_max;
    *busy_us = p->busy_us + (p->in_flight ? (uint64_t)((wu_now_ms() - p->busy_since) * 1000.0) : 0);
    *read_us = p->read_us;
    pthread_mutex_unlock(&p->mu);
}
