/* pool.c — a per-ctx fork-join pool. The caller is worker 0; workers 1..n-1 wait for a new
 * generation, spinning at most 50 µs before sleeping on a condition variable, and the
 * caller waits for the pending count the same way. wp_run splits [0,n) into contiguous
 * blocks, one per worker, so each output element has exactly one owner and results do not
 * depend on the thread count. With a CPU list, worker i is pinned to cpus[i]. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#define SPIN_NS 50000

struct wp_pool {
    uint32_t n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint_least64_t generation;
    atomic_uint pending;
    atomic_int quit;
    wp_fn fn;
    void *arg;
    uint32_t n_items;
};

typedef struct { wp_pool *p; uint32_t id; int cpu; } worker_arg;

static void block(uint32_t n_items, uint32_t n_workers, uint32_t id, uint32_t *b, uint32_t *e) {
    *b = (uint32_t)((uint64_t)n_items * id / n_workers);
    *e = (uint32_t)((uint64_t)n_items * (id + 1) / n_workers);
}

static int64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *v) {
    worker_arg *wa = v;
    wp_pool *p = wa->p;
    uint32_t id = wa->id;
    if (wa->cpu >= 0) {
        cpu_set_t set; CPU_ZERO(&set); CPU_SET(wa->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        int64_t t0 = now_ns();
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) {
            if (now_ns() - t0 > SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv_start, &p->mu);
                pthread_mutex_unlock(&p->mu);
                break;
            }
            relax();
        }
        if (atomic_load(&p->quit)) break;
        seen = atomic_load(&p->generation);
        uint32_t b, e; block(p->n_items, p->n, id, &b, &e);
        if (b < e) p->fn(p->arg, b, e);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
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
        wa->p = p; wa->id = i; wa->cpu = cpus ? cpus[i] : -1;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) { free(wa); wp_destroy(p); return WASTE_E_NOMEM; }
        p->n = i + 1;
    }
    /* Workers read p->n in block(); it is final before the first wp_run. */
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
    p->fn = fn; p->arg = arg; p->n_items = n;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);   /* seq_cst: publishes fn/arg/n_items */
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    uint32_t b, e; block(n, p->n, 0, &b, &e);
    if (b < e) fn(arg, b, e);
    int64_t t0 = now_ns();
    while (atomic_load(&p->pending)) {
        if (now_ns() - t0 > SPIN_NS) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->pending)) pthread_cond_wait(&p->cv_done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
        relax();
    }
}
