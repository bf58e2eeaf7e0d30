/* What every libFuzzer target shares: the property check and a scratch directory. */
#ifndef WASTE_FUZZKIT_H
#define WASTE_FUZZKIT_H

#include <stdio.h>
#include <stdlib.h>

/* A failed property aborts, so libFuzzer records the input as a crash. */
#define REQUIRE(cond)                                                                    \
    do {                                                                                 \
        if (!(cond)) { fprintf(stderr, "property failed %s:%d: %s\n", __FILE__, __LINE__, #cond); abort(); } \
    } while (0)

/* A fresh directory named waste-<tag>-XXXXXX into dir[cap]. Targets write many small files per
 * input, so it is in RAM (/dev/shm) when there is one, else in /tmp. */
static inline void fuzz_make_dir(char *dir, size_t cap, const char *tag) {
    snprintf(dir, cap, "/dev/shm/waste-%s-XXXXXX", tag);
    if (mkdtemp(dir)) return;
    snprintf(dir, cap, "/tmp/waste-%s-XXXXXX", tag);
    REQUIRE(mkdtemp(dir) != NULL);
}

#endif
