/* pool.c — a per-ctx fork-join pool. The caller is worker 0; workers 1..n-1 wait for a new
 * job, spinning at most 50 µs before sleeping on a condition variable, and the caller waits
 * for the job's end the same way.
 *
 * wp_run cuts [0,n) into up to WP_CHUNKS_PER_WORKER contiguous chunks per worker, and every
 * worker, the caller included, claims chunks until none is left. Each item is computed by
 * exactly one worker with the same code, so results do not depend on the thread count or on
 * who took which chunk. Claiming instead of a fixed block per worker matters on a shared
 * machine: a worker that is descheduled (a hypervisor's steal, a reader thread's wake-up, a
 * late wake from sleep) delays only the chunk it holds, and the others take the rest.
 *
 * The claim word holds the job's number, its chunk count and the next chunk, so a worker
 * still looking at a finished job can never claim a chunk of the next one; a worker reads the
 * job's function and bounds only after its claim succeeded, when the job cannot end (and be
 * replaced) before that chunk is done. With a CPU list, worker i is pinned to cpus[i]. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#define SPIN_NS 50000
#define WP_CHUNKS_PER_WORKER 4

/* claim = job << 32 | chunks << 16 | next chunk */
#define CLAIM_JOB(v) ((uint32_t)((v) >> 32))
#define CLAIM_CHUNKS(v) ((uint32_t)((v) >> 16) & 0xFFFFu)
#define CLAIM_NEXT(v) ((uint32_t)(v) & 0xFFFFu)

struct wp_pool {
    uint32_t n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint_least64_t claim;
    atomic_uint done;          /* chunks of the current job finished */
    atomic_int quit;
    /* The current job: written by the caller before the claim word publishes it. */
    wp_fn fn;
    void *arg;
    uint32_t n_items;
};

typedef struct { wp_pool *p; int cpu; } worker_arg;

static int64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits while pending(p, x): spins for up to SPIN_NS (the next job or the job's end is usually
 * microseconds away), then sleeps on cv, which is signalled under p->mu after the condition
 * changes. The workers wait for a new job this way, the caller for its job's end. */
static void spin_then_sleep(wp_pool *p, pthread_cond_t *cv, int (*pending)(wp_pool *, uint32_t), uint32_t x) {
    int64_t t0 = now_ns();
    while (pending(p, x)) {
        if (now_ns() - t0 > SPIN_NS) {
            pthread_mutex_lock(&p->mu);
            while (pending(p, x)) pthread_cond_wait(cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            return;
        }
        relax();
    }
}

/* A worker that has seen job `seen`: no newer job is published and the pool is not quitting. */
static int no_new_job(wp_pool *p, uint32_t seen) {
    return CLAIM_JOB(atomic_load(&p->claim)) == seen && !atomic_load(&p->quit);
}

/* The caller of a job cut into `chunks`: some chunk is not finished yet. */
static int job_running(wp_pool *p, uint32_t chunks) { return atomic_load(&p->done) < chunks; }

/* Claims and runs chunks of job `job` until none is left (or another job was published). */
static void run_chunks(wp_pool *p, uint32_t job) {
    for (;;) {
        uint64_t v = atomic_load(&p->claim);
        uint32_t chunks = CLAIM_CHUNKS(v), i = CLAIM_NEXT(v);
        if (CLAIM_JOB(v) != job || i >= chunks) return;
        if (!atomic_compare_exchange_weak(&p->claim, &v, v + 1)) continue;
        uint32_t n = p->n_items;
        uint32_t b = (uint32_t)((uint64_t)n * i / chunks), e = (uint32_t)((uint64_t)n * (i + 1) / chunks);
        if (b < e) p->fn(p->arg, b, e);
        if (atomic_fetch_add(&p->done, 1) + 1 == chunks) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *v) {
    worker_arg *wa = v;
    wp_pool *p = wa->p;
    if (wa->cpu >= 0) {
        cpu_set_t set; CPU_ZERO(&set); CPU_SET(wa->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    free(wa);
    uint32_t seen = 0;
    for (;;) {
        spin_then_sleep(p, &p->cv_start, no_new_job, seen);
        if (atomic_load(&p->quit)) break;
        seen = CLAIM_JOB(atomic_load(&p->claim));
        run_chunks(p, seen);
    }
    return NULL;
}

int32_t wp_create(uint32_t n_threads, const int *cpus, wp_pool **out) {
    *out = NULL;
    if (n_threads == 0) n_threads = 1;
    wp_pool *p = calloc(1, sizeof *p);
    if (!p) return WASTE_E_NOMEM;
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = calloc(n_threads, sizeof(pthread_t));
    if (!p->threads) { wp_destroy(p); return WASTE_E_NOMEM; }
    for (uint32_t i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { wp_destroy(p); return WASTE_E_NOMEM; }
        wa->p = p; wa->cpu = cpus ? cpus[i] : -1;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) { free(wa); wp_destroy(p); return WASTE_E_NOMEM; }
        p->n = i + 1;
    }
    *out = p;
    return WASTE_OK;
}

void wp_destroy(wp_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

uint32_t wp_size(const wp_pool *p) { return p->n; }

void wp_run(wp_pool *p, uint32_t n, wp_fn fn, void *arg) {
    if (p->n == 1 || n < 2) { if (n) fn(arg, 0, n); return; }
    uint32_t chunks = n < p->n * WP_CHUNKS_PER_WORKER ? n : p->n * WP_CHUNKS_PER_WORKER;
    /* Job numbers start at 1: a new worker has seen job 0, and 0 never runs. */
    uint32_t job = CLAIM_JOB(atomic_load(&p->claim)) + 1;
    if (job == 0) job = 1;
    p->fn = fn; p->arg = arg; p->n_items = n;
    atomic_store(&p->done, 0);
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->claim, (uint64_t)job << 32 | (uint64_t)chunks << 16);   /* seq_cst: publishes the job */
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, job);
    spin_then_sleep(p, &p->cv_done, job_running, chunks);
}
