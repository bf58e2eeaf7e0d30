/* fuzz_json.c — libFuzzer target for the manifest JSON reader (src/json.c).
 *
 * Parses arbitrary bytes; on success walks the DOM and checks what json.c promises
 * (docs/FORMAT.md §3 manifests are untrusted): strings hold no NUL and str_len matches,
 * object members carry keys and no key repeats, n_children counts the children, wj_get
 * finds members and wj_at array elements, the depth stays within 16 and the value count within the input
 * length + 1. On failure the detail must be non-empty and name manifest.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/internal.h"
#include "fuzzkit.h"


static uint64_t walk(const wj_val *v, int depth) {
    REQUIRE(depth <= 16);
    uint64_t count = 1;
    switch (v->type) {
    case WJ_NULL: case WJ_NUM: break;
    case WJ_BOOL: REQUIRE(v->num == 0 || v->num == 1); break;
    case WJ_STR: REQUIRE(v->str && strlen(v->str) == v->str_len); break;
    case WJ_ARR: case WJ_OBJ: {
        uint32_t i = 0;
        for (const wj_val *c = v->child; c; c = c->next, i++) {
            if (v->type == WJ_OBJ) {
                REQUIRE(c->key != NULL);
                REQUIRE(wj_get(v, c->key) == c);   /* unique keys: the first match is this one */
            } else {
                REQUIRE(c->key == NULL);
                REQUIRE(wj_at(v, i) == c);
            }
            count += walk(c, depth + 1);
        }
        REQUIRE(i == v->n_children);
        REQUIRE(wj_at(v, i) == NULL);   /* past the end, and always for objects */
        break;
    }
    default: REQUIRE(!"unknown type");
    }
    return count;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy so ASan sees any read past the end. */
    char *text = malloc(size ? size : 1);
    memcpy(text, data, size);
    char err[256];
    memset(err, 'x', sizeof err);
    wj_doc *doc = NULL;
    int32_t st = wj_parse(text, size, &doc, err, sizeof err);
    if (st == WASTE_OK) {
        REQUIRE(doc != NULL);
        uint64_t n = walk(wj_root(doc), 0);
        REQUIRE(n <= (uint64_t)size + 1);
        wj_free(doc);
    } else {
        REQUIRE(doc == NULL);
        REQUIRE(st == WASTE_E_FORMAT || st == WASTE_E_NOMEM);
        REQUIRE(memchr(err, 0, sizeof err) != NULL && err[0] != 0);
        REQUIRE(strstr(err, "manifest.json") != NULL);
    }
    free(text);
    return 0;
}
