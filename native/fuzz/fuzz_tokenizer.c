/* fuzz_tokenizer.c — libFuzzer target for the tokenizer (`make -C native fuzz`).
 *
 * Input: byte 0 holds flags, the rest is the text. Two tokenizers see it:
 *   - the internal one (wt_*) loaded from a richer fixture written here: the 256 bytes, a
 *     few hundred multi-byte ranks (so BPE merges chain and compete) and specials that
 *     share prefixes (so markup's longest match is exercised);
 *   - the public API (waste_tokenize / waste_tokenize_markup / waste_detokenize) on a
 *     tokenizer_only ctx over the C tests' container (tests/testkit.h), which adds add_bos
 *     and the E_SPACE contract.
 * Beyond "no crash, no sanitizer report" it checks properties that need no oracle:
 * invalid UTF-8 (an independent validator below) is E_ARG and valid text is OK;
 * detokenize(tokenize(text)) == text in both modes; plain mode never yields a special;
 * a short buffer gives E_SPACE with the same count; arbitrary ids detokenize or give E_ARG.
 * With -waste_long=1 (a slower campaign), flags 0x30 repeat the text past 26,000 code points
 * so Kimi's 25,000 code-point run limit cuts it.
 * A failed property aborts, which libFuzzer reports as a crash with the input saved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/tokenizer.h"
#include "../tests/testkit.h"
#include "fuzzkit.h"

#define FLAG_MARKUP 1u
#define FLAG_BOS 2u
#define FLAG_SHORT 4u
#define FLAG_IDS 8u   /* also detokenize the text's bytes read as ids */
#define FLAG_LONG 0x30u   /* with -waste_long=1: both bits repeat the text past Kimi's 25,000
                           * code-point run limit, so the pre-chunking splits are exercised */
#define LONG_CODE_POINTS 26000u

static int long_mode;   /* -waste_long=1 on the command line (slow: a separate campaign) */

static wt_tokenizer *rich;
static waste_ctx *api;
static uint32_t rich_base, rich_vocab, api_base, api_vocab;
static int32_t api_bos;


/* RFC 3629 validity, written independently of tokenizer.c: 1 when s[0..n) is UTF-8. */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t c = s[i], cp, need;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { need = 1; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { need = 2; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { need = 3; cp = c & 0x07; }
        else return 0;
        for (uint32_t k = 1; k <= need; k++) {
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

/* ---- the rich fixture --------------------------------------------------------------- */
static const char *EXTRA[] = {
    "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed", "is", "it",
    "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le", "ve", "co", "me", "de", "hi", "ri",
    "the", "ing", "and", "ion", "tio", "ent", "ati", "for", "her", "ter", "hat", "tha", "ere", "ate", "his",
    " the", " a", " t", " s", " o", " w", " i", " an", " th", " of", " and", " to", " in", "tion", "ation",
    "  ", "   ", "    ", "\n\n", "\r\n", "\n ", " \n", "\t\t", "..", "...", "--", "==", "//", "/*", "*/", "()",
    "{}", "[]", "<|", "|>", "12", "123", "1234", "00", "000", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
    "'S", "'LL", "\xc3\xa9", "\xc3\xa8", "\xc3\xa0", "\xe4\xb8\xad", "\xe6\x96\x87", "\xe4\xb8\xad\xe6\x96\x87",
    "\xf0\x9f\x98", "\xf0\x9f\x98\x80", "\xe2\x80\x94", "\xe2\x80\x9c", "\xd0\xbf", "\xd1\x80\xd0\xb8",
    "\xce\xb1", "\xce\xb2", "\xe3\x81\x82", "\xe3\x81\x84", "\xea\xb0\x80", "\xc2\xa0", "\xe2\x80\xa8",
    "ab", "abc", "abcd", "bcd", "cd", "xyz", "Hello", "hello", " Hello", " world", "world", "HTTP", "JSON",
};
static const char *SPECIALS[] = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_start|>", "<|im_middle|>", "<|im_user|>",
                                 "<|media_pad|>", "<|x|>", "<|x|>y", "<|"};

static void write_rich(const char *dir) {
    size_t n_extra = sizeof EXTRA / sizeof EXTRA[0], n_spec = sizeof SPECIALS / sizeof SPECIALS[0];
    char *ranks = malloc(64 * (256 + n_extra)), line[64], b64[64];
    size_t n = 0;
    for (size_t r = 0; r < 256 + n_extra; r++) {
        uint8_t byte = (uint8_t)r;
        if (r < 256) tk_b64(&byte, 1, b64);
        else tk_b64((const uint8_t *)EXTRA[r - 256], (int)strlen(EXTRA[r - 256]), b64);
        int len = snprintf(line, sizeof line, "%s %zu\n", b64, r);
        memcpy(ranks + n, line, (size_t)len); n += (size_t)len;
    }
    REQUIRE(tk_write_file(dir, "rich.tiktoken", ranks, n) == 0);
    free(ranks);
    char specials[2048] = "[";
    for (size_t i = 0; i < n_spec; i++)
        snprintf(specials + strlen(specials), sizeof specials - strlen(specials), "%s{\"id\": %zu, \"text\": \"%s\"}",
                 i ? ", " : "", 256 + n_extra + i + (i >= 5 ? 3 : 0), SPECIALS[i]);   /* a gap of 3 ids */
    strcat(specials, "]");
    REQUIRE(tk_write_file(dir, "rich-specials.json", specials, strlen(specials)) == 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int i = 1; i < *argc; i++) if (!strcmp((*argv)[i], "-waste_long=1")) long_mode = 1;
    char dir[] = "/tmp/waste-fuzztok-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    REQUIRE(tk_write_container(dir) == 0);
    write_rich(dir);
    char ranks[512], specials[512], err[512] = "";
    snprintf(ranks, sizeof ranks, "%s/rich.tiktoken", dir);
    snprintf(specials, sizeof specials, "%s/rich-specials.json", dir);
    if (wt_tokenizer_load(ranks, specials, &rich, err, sizeof err) != WT_OK) { fprintf(stderr, "fixture: %s\n", err); abort(); }
    rich_base = wt_n_base_vocab(rich);
    rich_vocab = wt_n_vocab(rich);
    waste_cfg cfg; waste_cfg_init(&cfg);
    cfg.usage_path = ""; cfg.n_threads = 1; cfg.tokenizer_only = 1;
    if (waste_open(dir, &cfg, &api, err, sizeof err) != WASTE_OK) { fprintf(stderr, "fixture: %s\n", err); abort(); }
    waste_model_info info; waste_model_info_init(&info);
    REQUIRE(waste_get_model_info(api, &info) == WASTE_OK);
    api_base = info.n_base_vocab;
    api_vocab = info.vocab;
    api_bos = info.bos_id;
    REQUIRE(api_bos >= 0);
    unlink(ranks); unlink(specials);
    tk_remove_container(dir);   /* both tokenizers hold copies of what they loaded */
    return 0;
}

static int32_t *ids_buf(size_t n) { return malloc((n ? n : 1) * sizeof(int32_t)); }

static void check_rich(const char *text, size_t len, int markup, int valid, int short_cap) {
    uint64_t n = 0;
    int32_t st = wt_tokenize(rich, text, len, markup, NULL, 0, &n);
    if (!valid) { REQUIRE(st == WT_E_ARG && n == 0); return; }
    REQUIRE(st == (n ? WT_E_SPACE : WT_OK));
    REQUIRE(n <= len);
    int32_t *ids = ids_buf(n);
    uint64_t n2 = 0;
    if (short_cap && n > 1) {
        REQUIRE(wt_tokenize(rich, text, len, markup, ids, n - 1, &n2) == WT_E_SPACE && n2 == n);
    }
    REQUIRE(wt_tokenize(rich, text, len, markup, ids, n, &n2) == WT_OK && n2 == n);
    char *back = malloc(len + 1);
    size_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        REQUIRE(ids[i] >= 0 && (uint32_t)ids[i] < rich_vocab);
        if (!markup) REQUIRE((uint32_t)ids[i] < rich_base);
        const uint8_t *b; uint64_t bl;
        REQUIRE(wt_token_bytes(rich, ids[i], &b, &bl) == WT_OK && bl > 0);
        REQUIRE(at + bl <= len);
        memcpy(back + at, b, bl); at += bl;
    }
    REQUIRE(at == len && memcmp(back, text, len) == 0);
    free(back); free(ids);
}

static void check_api(const char *text, size_t len, int markup, int add_bos, int valid, int short_cap) {
    uint64_t n = 0;
    int32_t st = markup ? waste_tokenize_markup(api, text, len, add_bos, NULL, 0, &n) : waste_tokenize(api, text, len, add_bos, NULL, 0, &n);
    if (!valid) { REQUIRE(st == WASTE_E_ARG && n == 0 && waste_last_error(api)[0]); return; }
    REQUIRE(st == (n ? WASTE_E_SPACE : WASTE_OK));
    int32_t *ids = ids_buf(n);
    uint64_t n2 = 0;
    if (short_cap && n > 1) {
        st = markup ? waste_tokenize_markup(api, text, len, add_bos, ids, n - 1, &n2) : waste_tokenize(api, text, len, add_bos, ids, n - 1, &n2);
        REQUIRE(st == WASTE_E_SPACE && n2 == n);
    }
    st = markup ? waste_tokenize_markup(api, text, len, add_bos, ids, n, &n2) : waste_tokenize(api, text, len, add_bos, ids, n, &n2);
    REQUIRE(st == WASTE_OK && n2 == n);
    uint64_t skip = add_bos ? 1 : 0;
    REQUIRE(n >= skip);
    if (add_bos) REQUIRE(ids[0] == api_bos);
    for (uint64_t i = skip; i < n; i++) if (!markup) REQUIRE(ids[i] >= 0 && (uint32_t)ids[i] < api_base);
    char *back = malloc(len + 1);
    uint64_t got = 0;
    REQUIRE(waste_detokenize(api, ids + skip, n - skip, back, len, &got) == WASTE_OK && got == len);
    REQUIRE(memcmp(back, text, len) == 0);
    free(back); free(ids);
}

/* Arbitrary ids: every one in [0, vocab) with text detokenizes; anything else is E_ARG. */
static void check_ids(const uint8_t *data, size_t size) {
    size_t n = size / 2;
    int32_t *ids = ids_buf(n);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(int16_t)(data[2 * i] | data[2 * i + 1] << 8) % (int32_t)(api_vocab + 8);
    uint64_t need = 0;
    int32_t st = waste_detokenize(api, ids, n, NULL, 0, &need);
    REQUIRE(st == WASTE_OK || st == WASTE_E_SPACE || st == WASTE_E_ARG);
    if (st != WASTE_E_ARG) {
        char *out = malloc(need ? need : 1);
        uint64_t got = 0;
        REQUIRE(waste_detokenize(api, ids, n, out, need, &got) == WASTE_OK && got == need);
        free(out);
    } else {
        REQUIRE(waste_last_error(api)[0] != 0);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    unsigned flags = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char *copy;
    size_t code_points = 0;
    for (size_t i = 0; i < len; i++) code_points += ((uint8_t)text[i] & 0xC0) != 0x80;
    if (long_mode && (flags & FLAG_LONG) == FLAG_LONG && code_points > 0) {
        size_t reps = (LONG_CODE_POINTS + code_points - 1) / code_points;
        copy = malloc(reps * len);
        for (size_t r = 0; r < reps; r++) memcpy(copy + r * len, text, len);
        len *= reps;
    } else {
        /* A copy exactly len bytes long, so ASan sees any read past the end of the text. */
        copy = malloc(len ? len : 1);
        memcpy(copy, text, len);
    }
    int valid = utf8_valid((const uint8_t *)copy, len);
    REQUIRE(valid == (wt_utf8_invalid_at(copy, len) == UINT64_MAX));
    check_rich(copy, len, (flags & FLAG_MARKUP) != 0, valid, (flags & FLAG_SHORT) != 0);
    check_api(copy, len, (flags & FLAG_MARKUP) != 0, (flags & FLAG_BOS) != 0, valid, (flags & FLAG_SHORT) != 0);
    if (flags & FLAG_IDS) check_ids((const uint8_t *)copy, len);
    free(copy);
    return 0;
}
