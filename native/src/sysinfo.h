/* sysinfo.h — what libwaste asks of the machine (sysinfo.c): usable RAM (physical memory
 * and every cgroup limit up the path), the CPUs this thread may run on, cfg.cpu_list
 * parsing and pinning the calling thread. Not public; knows nothing of waste_ctx. */
#ifndef WASTE_SYSINFO_H
#define WASTE_SYSINFO_H

#include <sched.h>

#include "internal.h"

/* min(physical RAM, cgroup v1/v2 memory limits from this process's cgroup up to the root). */
uint64_t wsys_usable_ram(void);
/* CPUs in this thread's affinity mask (at least 1). */
uint32_t wsys_cpus_available(void);
/* Parses "0-3,6" into CPU ids (at most 1024, each < CPU_SETSIZE); *out is malloc'd. */
int32_t wsys_parse_cpu_list(const char *s, int **out, uint32_t *n_out, char *err, uint64_t cap);

/* Pins the calling thread to cpus[0] for the length of a compute call (cpus NULL: does
 * nothing); unpin restores the affinity it had. */
typedef struct { int pinned; cpu_set_t saved; } wsys_pin;
void wsys_pin_caller(const int *cpus, wsys_pin *p);
void wsys_unpin_caller(wsys_pin *p);

#endif
