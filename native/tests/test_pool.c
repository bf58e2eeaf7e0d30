/* test_pool.c — the fork-join pool (src/pool.c): every item of a job runs exactly once, in
 * chunks, whatever the worker count; a job never sees a chunk of another (many short jobs back
 * to back, more workers than CPUs); and a worker that stalls inside its chunk does not keep
 * the others from taking the rest of the job (the reason chunks are claimed, not assigned).
 * Like test_kernels it reaches internal functions (src/internal.h, linked from libwaste.a). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

static int failures;
#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

/* ==== every item exactly once ====================================================== */
typedef struct {
    uint32_t job;               /* which job this is; the fn checks it is the pool's current one */
    atomic_uint *runs;          /* [n]: how often each item ran */
    atomic_uint calls, empty, foreign;
} cover_job;

static atomic_uint current_job;

static void cover(void *arg, uint32_t b, uint32_t e) {
    cover_job *j = arg;
    atomic_fetch_add(&j->calls, 1);
    if (b >= e) atomic_fetch_add(&j->empty, 1);
    if (atomic_load(&current_job) != j->job) atomic_fetch_add(&j->foreign, 1);
    for (uint32_t i = b; i < e; i++) atomic_fetch_add(&j->runs[i], 1);
}

static void every_item_once(void) {
    static const uint32_t threads[] = {1, 2, 3, 4, 7};
    static const uint32_t sizes[] = {0, 1, 2, 3, 5, 8, 9, 27, 28, 29, 64, 1000, 100003};
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        wp_pool *p = NULL;
        CHECK(wp_create(threads[ti], NULL, &p) == WASTE_OK && wp_size(p) == threads[ti]);
        if (!p) continue;
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            uint32_t n = sizes[si];
            cover_job j = {.job = (uint32_t)(ti * 100 + si + 1)};
            j.runs = calloc(n ? n : 1, sizeof *j.runs);
            atomic_store(&current_job, j.job);
            wp_run(p, n, cover, &j);
            uint32_t bad = 0;
            for (uint32_t i = 0; i < n; i++) bad += atomic_load(&j.runs[i]) != 1;
            if (bad) printf("FAIL: %u threads, %u items: %u items did not run exactly once\n", threads[ti], n, bad);
            CHECK(bad == 0 && atomic_load(&j.empty) == 0 && atomic_load(&j.foreign) == 0);
            /* at most 4 chunks per worker, and never more chunks than items */
            uint32_t calls = atomic_load(&j.calls);
            CHECK(calls <= (n < 4 * threads[ti] ? n : 4 * threads[ti]));
            CHECK(n < 2 || threads[ti] == 1 || calls > 1);
            free(j.runs);
        }
        wp_destroy(p);
    }
}

/* ==== jobs back to back ============================================================ */
/* Short jobs, one after the other, with more workers than CPUs: workers wake late, find the
 * job done, or are descheduled between reading the claim word and claiming. A chunk run under
 * the wrong job, or an item run twice or never, fails. */
static void jobs_back_to_back(void) {
    wp_pool *p = NULL;
    CHECK(wp_create(5, NULL, &p) == WASTE_OK);
    if (!p) return;
    enum { JOBS = 20000, N = 37 };
    atomic_uint runs[N];
    uint32_t bad_jobs = 0;
    for (uint32_t k = 1; k <= JOBS; k++) {
        for (uint32_t i = 0; i < N; i++) atomic_init(&runs[i], 0);
        cover_job j = {.job = 1000000 + k, .runs = runs};
        atomic_store(&current_job, j.job);
        uint32_t n = 2 + k % (N - 1);
        wp_run(p, n, cover, &j);
        uint32_t bad = atomic_load(&j.foreign) != 0;
        for (uint32_t i = 0; i < N; i++) bad += atomic_load(&runs[i]) != (i < n);
        bad_jobs += bad != 0;
    }
    if (bad_jobs) printf("FAIL: %u of %u back-to-back jobs ran an item twice, never, or under another job\n",
                         bad_jobs, (unsigned)JOBS);
    CHECK(bad_jobs == 0);
    wp_destroy(p);
}

/* ==== a stalled worker ============================================================= */
/* One worker stalls 30 ms inside the first chunk it takes (as a descheduled vCPU would). The
 * caller must take the other chunks meanwhile: with a fixed block per worker it would run
 * exactly half the items and then wait for the stalled one. */
typedef struct {
    pthread_t caller;
    atomic_uint by_caller, stalled;
} stall_job;

static void stall(void *arg, uint32_t b, uint32_t e) {
    stall_job *j = arg;
    if (pthread_equal(pthread_self(), j->caller)) {
        /* ~0.2 ms per chunk, so that the worker, spinning or woken, claims one meanwhile */
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 200000L);
        atomic_fetch_add(&j->by_caller, e - b);
        return;
    }
    if (atomic_exchange(&j->stalled, 1) == 0) {
        struct timespec ts = {0, 30 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void stalled_worker(void) {
    wp_pool *p = NULL;
    CHECK(wp_create(2, NULL, &p) == WASTE_OK);
    if (!p) return;
    uint32_t n = 800, by_caller = 0;
    int stalled = 0;
    /* The worker may wake only after the caller took every chunk: then nothing stalled and
     * the round proves nothing; a few rounds give it the chance. */
    for (int round = 0; round < 50 && !stalled; round++) {
        stall_job j = {.caller = pthread_self()};
        wp_run(p, n, stall, &j);
        stalled = (int)atomic_load(&j.stalled);
        by_caller = atomic_load(&j.by_caller);
    }
    /* 8 chunks of 100: the stalled worker holds one, the caller takes the other 7 */
    if (!stalled) printf("FAIL: the worker never took a chunk in 50 jobs of %u items\n", n);
    else if (by_caller != 700) printf("FAIL: with a worker stalled in its chunk the caller ran %u of %u items (want 700)\n", by_caller, n);
    CHECK(stalled && by_caller == 700);
    wp_destroy(p);
}

int main(void) {
    every_item_once();
    jobs_back_to_back();
    stalled_worker();
    if (failures) { printf("test_pool: %d failure(s)\n", failures); return 1; }
    printf("test_pool: ok\n");
    return 0;
}
