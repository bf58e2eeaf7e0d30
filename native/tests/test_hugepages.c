/* test_hugepages.c — the expert slots and the resident trunk are allocated 2 MiB-aligned and
 * advised for transparent huge pages (docs/ENGINE.md §5 Huge pages): wu_huge_alloc gives
 * zeroed, aligned memory in a region marked MADV_HUGEPAGE ("hg" in /proc/self/smaps VmFlags),
 * and opening a context marks at least its slots and its trunk (checked first, before the
 * helper's own regions exist). Where the
 * kernel has no madvise(MADV_HUGEPAGE) the check says SKIP with the reason. */
#include <sys/mman.h>

#include "internal.h"
#include "testkit.h"

/* Bytes of this process's mappings whose VmFlags carry "hg"; with addr, only the mapping
 * holding addr. -1 when smaps cannot be read. */
static long long advised_bytes(const void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    unsigned long lo = 0, hi = 0;
    long long total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2) { lo = a; hi = b; continue; }   /* a mapping's first line */
        if (strncmp(line, "VmFlags:", 8) != 0 || !strstr(line, " hg")) continue;
        if (addr && ((unsigned long)addr < lo || (unsigned long)addr >= hi)) continue;
        total += (long long)(hi - lo);
    }
    fclose(f);
    return total;
}

int main(void) {
#ifndef MADV_HUGEPAGE
    printf("test_hugepages: SKIP: this libc has no MADV_HUGEPAGE\n");
    return 0;
#else
    if (madvise(NULL, 0, MADV_HUGEPAGE) != 0) {   /* EINVAL: no THP in this kernel */
        printf("test_hugepages: SKIP: the kernel refuses MADV_HUGEPAGE (no transparent huge pages)\n");
        return 0;
    }
    char dir[] = "/tmp/waste-hugepages-XXXXXX";
    if (!mkdtemp(dir) || tk_write_container(dir)) { printf("FAIL: cannot write the container\n"); return 1; }
    long long before = advised_bytes(NULL);
    waste_cfg cfg; waste_cfg_init(&cfg); cfg.usage_path = "";
    waste_plan plan; waste_plan_init(&plan);
    char err[512];
    CHECK(waste_plan_memory(dir, &cfg, &plan, err, sizeof err) == WASTE_OK);
    waste_ctx *ctx = tk_open(dir, &cfg);
    CHECK(ctx != NULL);
    long long grown = advised_bytes(NULL) - before;
    if (grown < (long long)(plan.slots * plan.record_bytes + plan.trunk_bytes))
        printf("advised %lld bytes, slots %llu x %llu + trunk %llu\n", grown, (unsigned long long)plan.slots,
               (unsigned long long)plan.record_bytes, (unsigned long long)plan.trunk_bytes);
    CHECK(grown >= (long long)(plan.slots * plan.record_bytes + plan.trunk_bytes));
    waste_close(ctx);
    tk_remove_container(dir);

    uint64_t n = (3ull << 20) + 12345;
    uint8_t *p = wu_huge_alloc(n);
    CHECK(p != NULL);
    CHECK(((uintptr_t)p & ((2u << 20) - 1)) == 0);
    int zero = 1;
    for (uint64_t i = 0; i < n; i++) zero &= p[i] == 0;
    CHECK(zero);
    CHECK(advised_bytes(p) >= (long long)n);
    uint8_t *q = wu_aligned_alloc(4096, n);
    CHECK(q != NULL && advised_bytes(q) <= 0);   /* the plain allocator advises nothing */
    free(p); free(q);
    printf("test_hugepages: %s\n", tk_failures ? "FAILED" : "ok");
    return tk_failures ? 1 : 0;
#endif
}
