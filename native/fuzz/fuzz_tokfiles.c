/* fuzz_tokfiles.c — libFuzzer target for the tokenizer's file readers: tokenizer.tiktoken
 * (base64 + rank lines) and specials.json (its own small JSON reader), both container files
 * and so untrusted (docs/FORMAT.md).
 *
 * Input: the rank file, then optionally SEPARATOR and the specials file. Loading must
 * succeed or fail with a detail; a tokenizer that loads must keep its promises on a few
 * texts: every id it produces has bytes, plain mode stays below n_base_vocab, and
 * detokenize(tokenize(text)) == text in both modes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/tokenizer.h"
#include "../tests/testkit.h"
#include "fuzzkit.h"

#define SEPARATOR "\n#SPECIALS#\n"


static char dir[64];

static void make_dir(void) { fuzz_make_dir(dir, sizeof dir, "fuzztokf"); }
static char ranks_path[256], specials_path[256];

static void cleanup(void) { unlink(ranks_path); unlink(specials_path); rmdir(dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    make_dir();
    snprintf(ranks_path, sizeof ranks_path, "%s/tokenizer.tiktoken", dir);
    snprintf(specials_path, sizeof specials_path, "%s/specials.json", dir);
    atexit(cleanup);
    return 0;
}

static const char *TEXTS[] = {"", "hello world", "[BOS]x<|im_end|>\xc3\xa9\xe4\xb8\xad", "  \n\n\t 123 'll",
                              "<|media_pad|><|media_pad|>", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80!"};

static void roundtrip(const wt_tokenizer *t, const char *text, int markup) {
    size_t len = strlen(text);
    uint64_t n = 0;
    int32_t st = wt_tokenize(t, text, len, markup, NULL, 0, &n);
    REQUIRE(st == (n ? WT_E_SPACE : WT_OK));
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    REQUIRE(wt_tokenize(t, text, len, markup, ids, n, &n) == WT_OK);
    char *back = malloc(len + 1);
    size_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!markup) REQUIRE((uint32_t)ids[i] < wt_n_base_vocab(t));
        const uint8_t *b; uint64_t bl;
        REQUIRE(wt_token_bytes(t, ids[i], &b, &bl) == WT_OK);
        REQUIRE(at + bl <= len);
        memcpy(back + at, b, bl); at += bl;
    }
    REQUIRE(at == len && memcmp(back, text, len) == 0);
    free(back); free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *sep = memmem(data, size, SEPARATOR, strlen(SEPARATOR));
    size_t ranks_len = sep ? (size_t)(sep - data) : size;
    REQUIRE(tk_write_file(dir, "tokenizer.tiktoken", data, ranks_len) == 0);
    if (sep) {
        size_t off = ranks_len + strlen(SEPARATOR);
        REQUIRE(tk_write_file(dir, "specials.json", data + off, size - off) == 0);
    }
    char err[512];
    memset(err, 'x', sizeof err);
    wt_tokenizer *t = NULL;
    int32_t st = wt_tokenizer_load(ranks_path, sep ? specials_path : NULL, &t, err, sizeof err);
    if (st != WT_OK) {
        REQUIRE(t == NULL && memchr(err, 0, sizeof err) && err[0]);
        REQUIRE(st == WT_E_FORMAT || st == WT_E_NOMEM || st == WT_E_IO);
        return 0;
    }
    REQUIRE(wt_n_base_vocab(t) >= 256 && wt_n_vocab(t) >= wt_n_base_vocab(t));
    for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++) { roundtrip(t, TEXTS[i], 0); roundtrip(t, TEXTS[i], 1); }
    /* Every id below n_vocab either has bytes or is a gap between special ids. */
    uint32_t with_text = 0;
    for (uint32_t id = 0; id < wt_n_vocab(t) && id < wt_n_base_vocab(t) + 4096; id++) {
        const uint8_t *b; uint64_t bl;
        if (wt_token_bytes(t, (int32_t)id, &b, &bl) == WT_OK) { REQUIRE(bl > 0); with_text++; }
        else REQUIRE(id >= wt_n_base_vocab(t));
    }
    REQUIRE(with_text >= wt_n_base_vocab(t));
    const uint8_t *b; uint64_t bl;
    REQUIRE(wt_token_bytes(t, (int32_t)wt_n_vocab(t), &b, &bl) == WT_E_ARG);
    REQUIRE(wt_token_bytes(t, -1, &b, &bl) == WT_E_ARG);
    wt_tokenizer_free(t);
    return 0;
}
