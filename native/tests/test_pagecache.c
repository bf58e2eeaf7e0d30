/* test_pagecache.c — files the engine reads once and keeps its own copy of (manifest,
 * trunk, tokenizer files, bank headers, usage.waste) and the on-disk embedding rows read per
 * token leave no pages in the page cache (docs/ENGINE.md §5): each file is first read whole
 * so its pages are cached (checked with mincore), then the container is opened and used,
 * then mincore must show no page of any of those files resident. The test maps the files
 * only to ask mincore; the engine never maps anything. */
#include <fcntl.h>
#include <sys/mman.h>

#include "testkit.h"

/* Pages of path resident in the page cache, or -1 if it cannot be asked. */
static long resident_pages(const char *dir, const char *name) {
    char path[512]; snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) { close(fd); return -1; }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    long page = sysconf(_SC_PAGESIZE), n = (long)((st.st_size + page - 1) / page), res = 0;
    unsigned char *vec = malloc((size_t)n);
    if (!vec || mincore(m, (size_t)st.st_size, vec) != 0) res = -1;
    else for (long i = 0; i < n; i++) res += vec[i] & 1;
    free(vec);
    munmap(m, (size_t)st.st_size);
    return res;
}

/* Writes the file back (fsync: a dirty page cannot be dropped) and reads it whole. */
static int cache_file(const char *dir, const char *name) {
    char path[512]; snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    int ok = fsync(fd) == 0;
    char buf[65536];
    while (ok) { ssize_t r = read(fd, buf, sizeof buf); if (r <= 0) { ok = r == 0; break; } }
    close(fd);
    return ok ? 0 : -1;
}

int main(void) {
    char dir[] = "/tmp/waste-pagecache-XXXXXX";
    if (!mkdtemp(dir) || tk_write_container(dir)) { printf("FAIL: cannot write the container\n"); return 1; }
    /* usage.waste: written by a first context so the second one reads it at open */
    waste_ctx *ctx = tk_open(dir, NULL);
    CHECK(ctx != NULL);
    if (ctx) {
        int32_t ids[3] = {5, 6, 7};
        CHECK(waste_eval(ctx, ids, 3, NULL, 0) == WASTE_OK);
        char path[512]; snprintf(path, sizeof path, "%s/usage.waste", dir);
        CHECK(waste_save_usage(ctx, path) == WASTE_OK);
        waste_close(ctx);
    }
    static const char *owned[] = {"manifest.json", "trunk.bin", "tokenizer.tiktoken", "specials.json", "usage.waste"};
    enum { N_OWNED = sizeof owned / sizeof owned[0] };
    for (int i = 0; i < N_OWNED; i++) {
        CHECK(cache_file(dir, owned[i]) == 0);
        long before = resident_pages(dir, owned[i]);
        if (before <= 0) {
            /* a filesystem whose pages mincore cannot see (tmpfs keeps them): nothing to prove */
            printf("SKIP: %s shows %ld resident pages after a full read on this filesystem\n", owned[i], before);
            tk_remove_container(dir);
            return 0;
        }
    }
    waste_cfg cfg; waste_cfg_init(&cfg); cfg.n_threads = 1;
    char usage[512]; snprintf(usage, sizeof usage, "%s/usage.waste", dir);
    cfg.usage_path = usage;
    ctx = tk_open(dir, &cfg);
    CHECK(ctx != NULL);
    if (ctx) {
        /* decode a few tokens: the embedding is on disk (a row per token) */
        int32_t ids[4] = {9, 10, 11, 12};
        CHECK(waste_eval(ctx, ids, 4, NULL, 0) == WASTE_OK);
        for (int t = 0; t < 3; t++) CHECK(waste_eval(ctx, &ids[t], 1, NULL, 0) == WASTE_OK);
        for (int i = 0; i < N_OWNED; i++) {
            long after = resident_pages(dir, owned[i]);
            if (after != 0) printf("%s: %ld pages still cached after open and decode\n", owned[i], after);
            CHECK(after == 0);
        }
        waste_close(ctx);
    }
    tk_remove_container(dir);
    printf("test_pagecache: %s\n", tk_failures ? "FAILED" : "ok");
    return tk_failures ? 1 : 0;
}
