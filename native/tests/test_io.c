/* test_io.c — the reader pool (src/io.c): reads start in the order they are needed (the
 * lowest `need` first, the oldest among equals), a read needed later never starts beside one
 * needed sooner, reads of one need run side by side, every request is read exactly once and
 * its status comes back, and closing the pool finishes what is queued. The reads are the
 * test's own (wi_open's read function): each one records when it started and then blocks
 * until the test opens its gate, so every check below is decided by events, never by timing.
 * Like test_pool it reaches internal functions (src/io.h, linked from libwaste.a). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "io.h"

static int failures;
#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

/* A request with its gate; req first, so the read function gets back to the whole. */
typedef struct {
    wi_req req;
    int open;                   /* the gate: the read returns once it is set */
    int started;                /* the order it started in (1, 2, ...), 0 = not yet */
    int reads;                  /* how often it was read */
    int32_t status;             /* what its read returns */
} gated;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int n_started;

static int32_t gated_read(wi_req *r) {
    gated *g = (gated *)r;
    pthread_mutex_lock(&mu);
    g->started = ++n_started;
    g->reads++;
    pthread_cond_broadcast(&changed);
    while (!g->open) pthread_cond_wait(&changed, &mu);
    pthread_mutex_unlock(&mu);
    if (g->status) snprintf(r->err, sizeof r->err, "expert %u: test failure", r->e);
    return g->status;
}

static void reset(gated *g, int n) {
    memset(g, 0, (size_t)n * sizeof *g);
    pthread_mutex_lock(&mu);
    n_started = 0;
    pthread_mutex_unlock(&mu);
}

static void submit(wi_pool *p, gated *g, uint32_t e, uint32_t need) {
    g->req.e = e;
    g->req.need = need;
    wi_submit(p, &g->req);
}

/* Waits until g's read started; a read that never starts fails the test after 10 s instead
 * of hanging it (what a pool that takes the wrong request first would do). */
static int wait_started(gated *g) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&mu);
    int timed_out = 0;
    while (!g->started && !timed_out) timed_out = pthread_cond_timedwait(&changed, &mu, &until) != 0;
    int ok = g->started != 0;
    pthread_mutex_unlock(&mu);
    if (!ok) printf("FAIL: expert %u (need %u) did not start within 10 s\n", g->req.e, g->req.need);
    return ok;
}

static void open_gate(gated *g) {
    pthread_mutex_lock(&mu);
    g->open = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&mu);
}

static int started_of(gated *g) {
    pthread_mutex_lock(&mu);
    int s = g->started;
    pthread_mutex_unlock(&mu);
    return s;
}

/* One reader: while A (need 5) is being read, B (7), C (3), D (3), E (5) are queued; they
 * must start C, D, E, B: lowest need first, submission order among equals. */
static void lowest_need_first(void) {
    gated g[5];
    reset(g, 5);
    wi_pool *p = NULL;
    CHECK(wi_open(1, gated_read, &p) == WASTE_OK && p);
    if (!p) return;
    submit(p, &g[0], 0, 5);
    CHECK(wait_started(&g[0]));
    submit(p, &g[1], 1, 7);
    submit(p, &g[2], 2, 3);
    submit(p, &g[3], 3, 3);
    submit(p, &g[4], 4, 5);
    for (int i = 0; i < 5; i++) open_gate(&g[i]);
    for (int i = 0; i < 5; i++) wi_wait(p, &g[i].req);
    int want[5] = {1, 5, 2, 3, 4};
    for (int i = 0; i < 5; i++) {
        if (g[i].started != want[i]) printf("FAIL: request %d started %d-th, expected %d-th\n", i, g[i].started, want[i]);
        CHECK(g[i].started == want[i] && g[i].reads == 1);
    }
    wi_close(p);
}

/* Three readers: A (need 2) is being read; B (need 4) must not start while A is in flight,
 * although two readers are free, and C (need 2) must start beside A. Once A and C are done,
 * B starts. */
static void later_waits_for_sooner(void) {
    gated g[3];
    reset(g, 3);
    wi_pool *p = NULL;
    CHECK(wi_open(3, gated_read, &p) == WASTE_OK && p);
    if (!p) return;
    submit(p, &g[0], 0, 2);
    CHECK(wait_started(&g[0]));
    submit(p, &g[1], 1, 4);
    submit(p, &g[2], 2, 2);
    if (!wait_started(&g[2])) {   /* C starts beside A: reads of one need run side by side */
        failures++;
        for (int i = 0; i < 3; i++) open_gate(&g[i]);
        wi_close(p);
        return;
    }
    CHECK(started_of(&g[1]) == 0);
    CHECK(!wi_is_done(p, &g[1].req));
    open_gate(&g[0]);
    wi_wait(p, &g[0].req);
    CHECK(started_of(&g[1]) == 0); /* C (need 2) is still in flight */
    open_gate(&g[2]);
    wi_wait(p, &g[2].req);
    open_gate(&g[1]);
    wi_wait(p, &g[1].req);
    CHECK(g[1].started == 3 && g[1].reads == 1);
    wi_close(p);
}

/* Many requests of mixed needs on 4 readers, gates open: each is read once, a failing read's
 * status and detail come back, the deepest queue is counted; close after submitting the last
 * batch finishes them all before it returns. */
static void every_request_once(void) {
    enum { N = 100 };
    static gated g[N];
    reset(g, N);
    for (int i = 0; i < N; i++) { g[i].open = 1; g[i].status = i % 17 == 0 ? WASTE_E_IO : WASTE_OK; }
    wi_pool *p = NULL;
    CHECK(wi_open(4, gated_read, &p) == WASTE_OK && p);
    if (!p) return;
    for (int i = 0; i < N / 2; i++) submit(p, &g[i], (uint32_t)i, (uint32_t)(i * 7919) % 5);
    for (int i = 0; i < N / 2; i++) wi_wait(p, &g[i].req);
    for (int i = N / 2; i < N; i++) submit(p, &g[i], (uint32_t)i, (uint32_t)(i * 7919) % 5);
    uint32_t depth = 0; uint64_t busy = 0, read_us = 0;
    wi_stats(p, &depth, &busy, &read_us);
    CHECK(depth >= 1 && depth <= N / 2);
    wi_close(p);                  /* finishes the second half */
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bad += g[i].reads != 1 || g[i].req.state != WI_DONE || g[i].req.status != g[i].status;
        if (g[i].status) bad += strstr(g[i].req.err, "test failure") == NULL;
    }
    if (bad) printf("FAIL: %d of %d requests not read exactly once with their status\n", bad, N);
    CHECK(bad == 0);
}

int main(void) {
    lowest_need_first();
    later_waits_for_sooner();
    every_request_once();
    if (failures) { printf("test_io: %d failure(s)\n", failures); return 1; }
    printf("test_io: ok\n");
    return 0;
}
