/* sysinfo.c — the machine as libwaste sees it (sysinfo.h): cgroup memory limits, the
 * affinity mask, cfg.cpu_list and pinning of the calling thread. Calls only util.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sysinfo.h"

/* ==== usable RAM: min(physical, cgroup limits up the path) ======================== */
static uint64_t read_limit(const char *path) {
    FILE *f = fopen(path, "re");
    if (!f) return UINT64_MAX;
    char buf[64] = {0};
    uint64_t v = UINT64_MAX;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3)) {
        char *end; unsigned long long x = strtoull(buf, &end, 10);
        if (end != buf) v = x;
    }
    fclose(f);
    return v;
}

static uint64_t cgroup_limit(void) {
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return UINT64_MAX;
    char line[1024];
    uint64_t best = UINT64_MAX;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'); if (!c1) continue;
        char *c2 = strchr(c1 + 1, ':'); if (!c2) continue;
        *c2 = 0;
        const char *ctrl = c1 + 1, *rel = c2 + 1;
        int v2 = ctrl[0] == 0, v1mem = strstr(ctrl, "memory") != NULL;
        if (!v2 && !v1mem) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s", rel);
        for (;;) {
            char file[1400];
            if (v2) {
                snprintf(file, sizeof file, "/sys/fs/cgroup%s/memory.max", path);
                uint64_t a = read_limit(file); if (a < best) best = a;
                snprintf(file, sizeof file, "/sys/fs/cgroup%s/memory.high", path);
                a = read_limit(file); if (a < best) best = a;
            } else {
                snprintf(file, sizeof file, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", path);
                uint64_t a = read_limit(file); if (a < best) best = a;
            }
            char *slash = strrchr(path, '/');
            if (!slash || (slash == path && path[1] == 0)) break;
            if (slash == path) path[1] = 0; else *slash = 0;
        }
    }
    fclose(f);
    return best;
}

uint64_t wsys_usable_ram(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t phys = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
    uint64_t cg = cgroup_limit();
    return cg < phys ? cg : phys;
}

/* ==== CPUs ========================================================================= */
uint32_t wsys_cpus_available(void) {
    cpu_set_t set;
    uint32_t n = sched_getaffinity(0, sizeof set, &set) == 0 ? (uint32_t)CPU_COUNT(&set) : 1;
    return n ? n : 1;
}

int32_t wsys_parse_cpu_list(const char *s, int **out, uint32_t *n_out, char *err, uint64_t cap) {
    int *cpus = malloc(1024 * sizeof(int));
    uint32_t n = 0;
    if (!cpus) { wu_errf(err, cap, "out of memory"); return WASTE_E_NOMEM; }
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0) goto bad;
        p = end;
        if (*p == '-') {
            p++;
            b = strtol(p, &end, 10);
            if (end == p || b < a) goto bad;
            p = end;
        }
        if (b >= CPU_SETSIZE) goto bad;
        for (long c = a; c <= b; c++) { if (n >= 1024) goto bad; cpus[n++] = (int)c; }
        if (*p == ',') p++;
        else if (*p) goto bad;
    }
    if (n == 0) goto bad;
    *out = cpus; *n_out = n;
    return WASTE_OK;
bad:
    free(cpus);
    wu_errf(err, cap, "cfg.cpu_list \"%s\" is not a list like \"0-3,6\" of CPUs below %d", s, CPU_SETSIZE);
    return WASTE_E_ARG;
}

/* The caller is worker 0 of the pool: pinned to the first listed CPU only during compute
 * calls, so the thread is the application's again between them. */
void wsys_pin_caller(const int *cpus, wsys_pin *p) {
    p->pinned = 0;
    if (!cpus) return;
    if (pthread_getaffinity_np(pthread_self(), sizeof p->saved, &p->saved) != 0) return;
    cpu_set_t set; CPU_ZERO(&set); CPU_SET(cpus[0], &set);
    p->pinned = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

void wsys_unpin_caller(wsys_pin *p) {
    if (p->pinned) pthread_setaffinity_np(pthread_self(), sizeof p->saved, &p->saved);
}
