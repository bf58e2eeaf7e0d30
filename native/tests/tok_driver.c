/* tok_driver.c — command-line harness for the tokenizer (tests and manual checks).
 *
 *   tok_driver RANKS [--specials FILE] [--markup] [MODE] [INPUT]
 *
 * MODE: (none) prints the ids of INPUT (stdin when absent) on one line;
 *       --decode reads whitespace-separated ids and writes their bytes;
 *       --roundtrip tokenizes, checks the ids' bytes equal the input, prints "ok N";
 *       input that is not valid UTF-8 is refused ("status -5: invalid UTF-8 at byte N");
 *       --info prints "n_base_vocab N n_vocab M unicode V".
 * Exit status: 0 success, 1 a tokenizer error (status and detail on stderr), 2 a failed
 * round trip, 64 bad usage. Builds against native/src only:
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -Inative/src native/tests/tok_driver.c \
 *       native/src/tokenizer.c native/src/unicode_tables.c -o tok_driver
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode_tables.h"

static int usage(void)
{
    fprintf(stderr, "usage: tok_driver RANKS [--specials FILE] [--markup] "
                    "[--decode|--roundtrip|--info] [INPUT]\n");
    return 64;
}

static uint8_t *slurp(FILE *f, uint64_t *len)
{
    uint64_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf != NULL) {
        if (n == cap) {
            uint8_t *grown = realloc(buf, cap * 2);
            if (grown == NULL) break;
            buf = grown;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, (size_t)(cap - n), f);
        n += got;
        if (got == 0) {
            *len = n;
            return buf;
        }
    }
    free(buf);
    return NULL;
}

/* Tokenizes with a first call of capacity 0, which must report the size needed. */
static int32_t tokenize(const wt_tokenizer *t, const uint8_t *text, uint64_t len, int markup,
                        int32_t **ids, uint64_t *n)
{
    uint64_t need = 0;
    int32_t st = wt_tokenize(t, (const char *)text, len, markup, NULL, 0, &need);
    if (st != WT_OK && st != WT_E_SPACE) return st;
    *ids = malloc((size_t)(need ? need : 1) * sizeof **ids);
    if (*ids == NULL) return WT_E_NOMEM;
    st = wt_tokenize(t, (const char *)text, len, markup, *ids, need, n);
    if (st == WT_OK && *n != need) st = WT_E_SPACE;
    return st;
}

int main(int argc, char **argv)
{
    const char *ranks = NULL, *specials = NULL, *input = NULL, *mode = "";
    int markup = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--specials") == 0 && i + 1 < argc) specials = argv[++i];
        else if (strcmp(argv[i], "--markup") == 0) markup = 1;
        else if (strcmp(argv[i], "--decode") == 0 || strcmp(argv[i], "--roundtrip") == 0 ||
                 strcmp(argv[i], "--info") == 0)
            mode = argv[i];
        else if (argv[i][0] == '-' && argv[i][1] == '-') return usage();
        else if (ranks == NULL) ranks = argv[i];
        else if (input == NULL) input = argv[i];
        else return usage();
    }
    if (ranks == NULL) return usage();

    char err[512];
    wt_tokenizer *t = NULL;
    int32_t st = wt_tokenizer_load(ranks, specials, &t, err, sizeof err);
    if (st != WT_OK) {
        fprintf(stderr, "status %d: %s\n", st, err);
        return 1;
    }
    if (strcmp(mode, "--info") == 0) {
        printf("n_base_vocab %u n_vocab %u unicode %s\n", wt_n_base_vocab(t), wt_n_vocab(t),
               WT_UNICODE_VERSION);
        wt_tokenizer_free(t);
        return 0;
    }
    FILE *f = input ? fopen(input, "rb") : stdin;
    uint64_t len = 0;
    uint8_t *text = f ? slurp(f, &len) : NULL;
    if (f && input) fclose(f);
    if (text == NULL) {
        fprintf(stderr, "cannot read %s\n", input ? input : "stdin");
        wt_tokenizer_free(t);
        return 1;
    }
    int rc = 0;
    if (strcmp(mode, "--decode") == 0) {
        uint8_t *terminated = realloc(text, len + 1);
        if (terminated == NULL) {
            free(text);
            wt_tokenizer_free(t);
            return 1;
        }
        text = terminated;
        text[len] = 0;
        char *p = (char *)text, *end;
        for (;;) {
            long id = strtol(p, &end, 10);
            if (end == p) break;
            p = end;
            const uint8_t *bytes;
            uint64_t n;
            if ((st = wt_token_bytes(t, (int32_t)id, &bytes, &n)) != WT_OK) {
                fprintf(stderr, "status %d: id %ld\n", st, id);
                rc = 1;
                break;
            }
            fwrite(bytes, 1, (size_t)n, stdout);
        }
    } else {
        int32_t *ids = NULL;
        uint64_t n = 0;
        st = tokenize(t, text, len, markup, &ids, &n);
        if (st != WT_OK) {
            if (st == WT_E_ARG && wt_utf8_invalid_at((const char *)text, len) != UINT64_MAX)
                fprintf(stderr, "status %d: invalid UTF-8 at byte %" PRIu64 "\n", st,
                        wt_utf8_invalid_at((const char *)text, len));
            else
                fprintf(stderr, "status %d\n", st);
            rc = 1;
        } else if (strcmp(mode, "--roundtrip") == 0) {
            uint64_t pos = 0;
            for (uint64_t i = 0; i < n && rc == 0; i++) {
                const uint8_t *bytes;
                uint64_t blen;
                if (wt_token_bytes(t, ids[i], &bytes, &blen) != WT_OK || pos + blen > len ||
                    memcmp(text + pos, bytes, (size_t)blen) != 0 ||
                    (!markup && (uint32_t)ids[i] >= wt_n_base_vocab(t)))
                    rc = 2;
                pos += blen;
            }
            if (rc == 0 && pos != len) rc = 2;
            if (rc == 0) printf("ok %" PRIu64 "\n", n);
            else fprintf(stderr, "round trip failed\n");
        } else {
            for (uint64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
        }
        free(ids);
    }
    free(text);
    wt_tokenizer_free(t);
    return rc;
}
