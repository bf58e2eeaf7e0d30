/* tokenizer.c — Kimi's BPE tokenizer, id-for-id identical to PyPI tiktoken.
 *
 * Sections: errors and files, rank table (hash), rank-file loader, specials.json loader,
 * UTF-8, the PAT scanner, BPE, the tokenize pipeline, accessors. tokenizer.h documents
 * the pipeline; input that is not valid UTF-8 is refused (WT_E_ARG).
 */
#define _POSIX_C_SOURCE 200809L

#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "unicode_tables.h"

#define NO_RANK UINT32_MAX
#define NO_NODE UINT32_MAX

typedef struct {
    int32_t id;
    uint32_t len;
    uint8_t *text; /* owned, NUL-terminated */
} wt_special;

struct wt_tokenizer {
    uint32_t n_base;        /* number of ranks */
    uint32_t n_vocab;       /* 1 + the largest id */
    uint32_t max_token_len; /* longest rank entry, to skip hopeless lookups */
    uint8_t *bytes;         /* token bytes concatenated in rank order */
    uint64_t *offsets;      /* [n_base + 1]: token r is bytes[offsets[r], offsets[r+1]) */
    uint32_t *slots;        /* open addressing: rank + 1, 0 = empty */
    uint64_t slot_mask;
    wt_special *specials;   /* sorted by id */
    uint32_t n_specials;
    const wt_special **by_first; /* grouped by first byte, longest first (into specials) */
    uint32_t first_start[257];
};

/* ======================================================================== errors, files */

__attribute__((format(printf, 3, 4))) static void set_err(char *err, uint64_t cap,
                                                          const char *fmt, ...)
{
    if (err == NULL || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)(cap > (uint64_t)INT_MAX ? (uint64_t)INT_MAX : cap), fmt, ap);
    va_end(ap);
}

/* Reads a whole tokenizer file. Only a regular file is read (opened with O_NONBLOCK so a
 * FIFO cannot block, fstat-checked, then back to blocking reads) and at most
 * WT_MAX_FILE_BYTES of it: /dev/zero or a huge file is refused, not read until OOM. */
static int32_t read_file(const char *path, uint8_t **data, uint64_t *len, char *err,
                         uint64_t cap)
{
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        set_err(err, cap, "%s: cannot open: %s", path, strerror(errno));
        return WT_E_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        set_err(err, cap, "%s: not a regular file", path);
        return WT_E_IO;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size > WT_MAX_FILE_BYTES) {
        close(fd);
        set_err(err, cap, "%s: %llu bytes, above the %u MiB limit for tokenizer files", path,
                (unsigned long long)size, WT_MAX_FILE_BYTES >> 20);
        return WT_E_FORMAT;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    uint8_t *buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        close(fd);
        return WT_E_NOMEM;
    }
    uint64_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, buf + got, (size_t)(size - got), (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (uint64_t)r;
    }
    close(fd);
    if (got != size) {
        free(buf);
        set_err(err, cap, "%s: read error (%llu of %llu bytes)", path, (unsigned long long)got,
                (unsigned long long)size);
        return WT_E_IO;
    }
    *data = buf;
    *len = size;
    return WT_OK;
}

/* ======================================================================== rank table */

static uint64_t hash_bytes(const uint8_t *p, uint64_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n > 0) memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    return h;
}

static uint32_t rank_of(const wt_tokenizer *t, const uint8_t *p, uint64_t n)
{
    if (n == 0 || n > t->max_token_len) return NO_RANK;
    uint64_t i = hash_bytes(p, n) & t->slot_mask;
    for (;;) {
        uint32_t s = t->slots[i];
        if (s == 0) return NO_RANK;
        uint32_t r = s - 1;
        uint64_t off = t->offsets[r];
        if (t->offsets[r + 1] - off == n && memcmp(t->bytes + off, p, (size_t)n) == 0) return r;
        i = (i + 1) & t->slot_mask;
    }
}

/* Inserts rank r; returns the rank already holding the same bytes, or NO_RANK. */
static uint32_t rank_insert(wt_tokenizer *t, uint32_t r)
{
    const uint8_t *p = t->bytes + t->offsets[r];
    uint64_t n = t->offsets[r + 1] - t->offsets[r];
    uint64_t i = hash_bytes(p, n) & t->slot_mask;
    for (;;) {
        uint32_t s = t->slots[i];
        if (s == 0) {
            t->slots[i] = r + 1;
            return NO_RANK;
        }
        uint32_t q = s - 1;
        uint64_t off = t->offsets[q];
        if (t->offsets[q + 1] - off == n && memcmp(t->bytes + off, p, (size_t)n) == 0) return q;
        i = (i + 1) & t->slot_mask;
    }
}

/* ======================================================================== rank file */

static int b64_value(uint8_t c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict standard base64 with padding; writes at most 3*n/4 bytes; -1 when malformed. */
static int64_t b64_decode(const uint8_t *s, uint64_t n, uint8_t *out)
{
    if (n == 0 || n % 4 != 0) return -1;
    uint64_t o = 0;
    for (uint64_t i = 0; i < n; i += 4) {
        int last = i + 4 == n;
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && last && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad > 0 || (v[k] = b64_value(s[i + k])) < 0) {
                return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return (int64_t)o;
}

typedef struct {
    uint64_t start, len; /* within the file */
    uint32_t lineno;
} line_ref;

/* Parses "<base64> <rank>" lines into t->bytes/offsets (rank order) and the hash. */
static int32_t parse_ranks(wt_tokenizer *t, const char *path, const uint8_t *data,
                           uint64_t size, char *err, uint64_t cap)
{
    /* Pass 1: the non-empty lines. */
    uint64_t n_lines = 0;
    for (uint64_t i = 0; i < size; i++)
        if (data[i] == '\n') n_lines++;
    n_lines++;
    line_ref *lines = malloc((size_t)n_lines * sizeof *lines);
    if (lines == NULL) return WT_E_NOMEM;
    uint64_t n = 0;
    uint32_t lineno = 0;
    for (uint64_t i = 0; i < size;) {
        uint64_t j = i;
        while (j < size && data[j] != '\n') j++;
        lineno++;
        uint64_t e = j;
        if (e > i && data[e - 1] == '\r') e--;
        if (e > i) lines[n++] = (line_ref){i, e - i, lineno};
        i = j + 1;
    }
    int32_t st = WT_OK;
    uint32_t *line_of_rank = NULL;
    uint8_t *tmp = NULL;
    uint64_t *tmp_off = NULL;
    if (n == 0 || n > (uint64_t)INT32_MAX) {
        set_err(err, cap, "%s: %s", path, n == 0 ? "no rank lines" : "too many rank lines");
        st = WT_E_FORMAT;
        goto done;
    }
    line_of_rank = malloc((size_t)n * sizeof *line_of_rank);
    tmp = malloc((size_t)size + 1);
    tmp_off = malloc((size_t)(n + 1) * sizeof *tmp_off);
    if (line_of_rank == NULL || tmp == NULL || tmp_off == NULL) {
        st = WT_E_NOMEM;
        goto done;
    }
    for (uint64_t r = 0; r < n; r++) line_of_rank[r] = UINT32_MAX;

    /* Pass 2: decode each line; ranks must be dense (< n) and unique. */
    uint64_t used = 0;
    for (uint64_t k = 0; k < n; k++) {
        const uint8_t *s = data + lines[k].start;
        uint64_t len = lines[k].len, sp = 0;
        while (sp < len && s[sp] != ' ') sp++;
        if (sp == len || sp == 0 || sp + 1 == len) {
            set_err(err, cap, "%s:%u: expected '<base64> <rank>'", path, lines[k].lineno);
            st = WT_E_FORMAT;
            goto done;
        }
        uint64_t rank = 0;
        for (uint64_t d = sp + 1; d < len; d++) {
            if (s[d] < '0' || s[d] > '9' || d - sp > 10) {
                set_err(err, cap, "%s:%u: rank is not a decimal number", path,
                        lines[k].lineno);
                st = WT_E_FORMAT;
                goto done;
            }
            rank = rank * 10 + (uint64_t)(s[d] - '0');
        }
        if (rank >= n) {
            set_err(err, cap,
                    "%s:%u: rank %llu out of range: ranks must be dense 0..%llu", path,
                    lines[k].lineno, (unsigned long long)rank, (unsigned long long)(n - 1));
            st = WT_E_FORMAT;
            goto done;
        }
        if (line_of_rank[rank] != UINT32_MAX) {
            set_err(err, cap, "%s:%u: duplicate rank %llu (also on line %u)", path,
                    lines[k].lineno, (unsigned long long)rank,
                    lines[line_of_rank[rank]].lineno);
            st = WT_E_FORMAT;
            goto done;
        }
        int64_t got = b64_decode(s, sp, tmp + used);
        if (got <= 0) {
            set_err(err, cap, "%s:%u: bad base64 token", path, lines[k].lineno);
            st = WT_E_FORMAT;
            goto done;
        }
        line_of_rank[rank] = (uint32_t)k;
        tmp_off[k] = used;
        used += (uint64_t)got;
    }
    tmp_off[n] = used;

    /* Lay the bytes out in rank order and hash them. */
    t->n_base = (uint32_t)n;
    t->bytes = malloc((size_t)used + 1);
    t->offsets = malloc((size_t)(n + 1) * sizeof *t->offsets);
    uint64_t slots = 1;
    while (slots < 2 * n) slots <<= 1;
    t->slots = calloc((size_t)slots, sizeof *t->slots);
    t->slot_mask = slots - 1;
    if (t->bytes == NULL || t->offsets == NULL || t->slots == NULL) {
        st = WT_E_NOMEM;
        goto done;
    }
    uint64_t o = 0;
    for (uint64_t r = 0; r < n; r++) {
        uint64_t k = line_of_rank[r];
        uint64_t len = tmp_off[k + 1] - tmp_off[k]; /* tmp_off is in line order */
        memcpy(t->bytes + o, tmp + tmp_off[k], (size_t)len);
        t->offsets[r] = o;
        o += len;
        if (len > t->max_token_len) t->max_token_len = (uint32_t)len;
    }
    t->offsets[n] = o;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t q = rank_insert(t, r);
        if (q != NO_RANK) {
            uint32_t a = lines[line_of_rank[q]].lineno, b = lines[line_of_rank[r]].lineno;
            set_err(err, cap, "%s:%u: duplicate token bytes (also on line %u)", path,
                    a > b ? a : b, a > b ? b : a);
            st = WT_E_FORMAT;
            goto done;
        }
    }
    for (uint32_t b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (rank_of(t, &byte, 1) == NO_RANK) {
            set_err(err, cap, "%s: no entry for the single byte 0x%02X (all 256 required)",
                    path, b);
            st = WT_E_FORMAT;
            goto done;
        }
    }
done:
    free(lines);
    free(line_of_rank);
    free(tmp);
    free(tmp_off);
    return st;
}

/* ======================================================================== specials.json */

typedef struct {
    const uint8_t *s, *p, *end;
    const char *path;
    char *err;
    uint64_t cap;
} json_cur;

static uint32_t json_line(const json_cur *c)
{
    uint32_t line = 1;
    for (const uint8_t *q = c->s; q < c->p && q < c->end; q++)
        if (*q == '\n') line++;
    return line;
}

static int32_t json_fail(json_cur *c, const char *what)
{
    set_err(c->err, c->cap, "%s:%u: %s", c->path, json_line(c), what);
    return WT_E_FORMAT;
}

static void json_ws(json_cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int json_hex4(json_cur *c, uint32_t *v)
{
    if (c->end - c->p < 4) return 0;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t h = c->p[k];
        int d = h >= '0' && h <= '9' ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) return 0;
        *v = *v << 4 | (uint32_t)d;
    }
    c->p += 4;
    return 1;
}

static unsigned utf8_decode(const uint8_t *s, uint64_t n, uint32_t *cp);

/* Parses a string at c->p (on the quote). *out (malloc'd, NUL-terminated) when out != NULL. */
static int32_t json_string(json_cur *c, uint8_t **out, uint32_t *out_len)
{
    c->p++; /* opening quote */
    uint64_t avail = (uint64_t)(c->end - c->p);
    uint8_t *buf = out ? malloc((size_t)avail + 1) : NULL;
    if (out && buf == NULL) return WT_E_NOMEM;
    uint64_t n = 0;
    for (;;) {
        if (c->p >= c->end) {
            free(buf);
            return json_fail(c, "unterminated string");
        }
        uint8_t ch = *c->p;
        if (ch == '"') {
            c->p++;
            break;
        }
        if (ch < 0x20) {
            free(buf);
            return json_fail(c, "control character in string");
        }
        if (ch != '\\') {
            uint32_t cp;
            unsigned k = utf8_decode(c->p, (uint64_t)(c->end - c->p), &cp);
            if (k == 0) {
                free(buf);
                return json_fail(c, "invalid UTF-8 in string");
            }
            if (buf) memcpy(buf + n, c->p, k);
            n += k;
            c->p += k;
            continue;
        }
        c->p++;
        if (c->p >= c->end) continue; /* reported as unterminated */
        uint8_t e = *c->p++;
        uint32_t cp = 0;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'u': {
            if (!json_hex4(c, &cp)) {
                free(buf);
                return json_fail(c, "bad \\u escape");
            }
            if (cp >= 0xDC00 && cp < 0xE000) {
                free(buf);
                return json_fail(c, "lone low surrogate in \\u escape");
            }
            if (cp >= 0xD800 && cp < 0xDC00) {
                uint32_t lo;
                if (c->end - c->p < 2 || c->p[0] != '\\' || c->p[1] != 'u') {
                    free(buf);
                    return json_fail(c, "lone high surrogate in \\u escape");
                }
                c->p += 2;
                if (!json_hex4(c, &lo) || lo < 0xDC00 || lo >= 0xE000) {
                    free(buf);
                    return json_fail(c, "bad surrogate pair in \\u escape");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            break;
        }
        default:
            free(buf);
            return json_fail(c, "bad escape in string");
        }
        /* An escape is never longer than its UTF-8 (\uXXXX is 6 bytes), so buf fits. */
        if (buf) {
            if (cp < 0x80) {
                buf[n++] = (uint8_t)cp;
            } else if (cp < 0x800) {
                buf[n++] = (uint8_t)(0xC0 | cp >> 6);
                buf[n++] = (uint8_t)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[n++] = (uint8_t)(0xE0 | cp >> 12);
                buf[n++] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
                buf[n++] = (uint8_t)(0x80 | (cp & 0x3F));
            } else {
                buf[n++] = (uint8_t)(0xF0 | cp >> 18);
                buf[n++] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
                buf[n++] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
                buf[n++] = (uint8_t)(0x80 | (cp & 0x3F));
            }
        }
    }
    if (buf) {
        if (n > UINT32_MAX - 1) {
            free(buf);
            return json_fail(c, "string too long");
        }
        buf[n] = 0;
        *out = buf;
        *out_len = (uint32_t)n;
    }
    return WT_OK;
}

/* Parses a JSON number; *is_int when it is a plain integer that fits int64. */
static int32_t json_number(json_cur *c, int64_t *value, int *is_int)
{
    const uint8_t *q = c->p;
    int neg = 0;
    if (q < c->end && *q == '-') {
        neg = 1;
        q++;
    }
    if (q >= c->end || *q < '0' || *q > '9') return json_fail(c, "bad number");
    int64_t v = 0;
    int overflow = 0;
    if (*q == '0') {
        q++;
    } else {
        while (q < c->end && *q >= '0' && *q <= '9') {
            if (v > (INT64_MAX - 9) / 10) overflow = 1;
            else v = v * 10 + (*q - '0');
            q++;
        }
    }
    *is_int = !overflow;
    if (q < c->end && *q == '.') {
        *is_int = 0;
        q++;
        if (q >= c->end || *q < '0' || *q > '9') return json_fail(c, "bad number");
        while (q < c->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < c->end && (*q == 'e' || *q == 'E')) {
        *is_int = 0;
        q++;
        if (q < c->end && (*q == '+' || *q == '-')) q++;
        if (q >= c->end || *q < '0' || *q > '9') return json_fail(c, "bad number");
        while (q < c->end && *q >= '0' && *q <= '9') q++;
    }
    *value = neg ? -v : v;
    c->p = q;
    return WT_OK;
}

static int32_t json_skip_value(json_cur *c, int depth)
{
    if (depth > 64) return json_fail(c, "nesting too deep");
    json_ws(c);
    if (c->p >= c->end) return json_fail(c, "unexpected end of file");
    uint8_t ch = *c->p;
    if (ch == '"') return json_string(c, NULL, NULL);
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        int64_t v;
        int is_int;
        return json_number(c, &v, &is_int);
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t wl = strlen(words[k]);
        if ((size_t)(c->end - c->p) >= wl && memcmp(c->p, words[k], wl) == 0) {
            c->p += wl;
            return WT_OK;
        }
    }
    if (ch != '[' && ch != '{') return json_fail(c, "unexpected character");
    uint8_t close = ch == '[' ? ']' : '}';
    c->p++;
    json_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return WT_OK;
    }
    for (;;) {
        int32_t st;
        if (close == '}') {
            json_ws(c);
            if (c->p >= c->end || *c->p != '"') return json_fail(c, "expected a key");
            if ((st = json_string(c, NULL, NULL)) != WT_OK) return st;
            json_ws(c);
            if (c->p >= c->end || *c->p != ':') return json_fail(c, "expected ':'");
            c->p++;
        }
        if ((st = json_skip_value(c, depth + 1)) != WT_OK) return st;
        json_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return WT_OK;
        }
        return json_fail(c, "expected ',' or a closing bracket");
    }
}

/* One {"id": int, "text": string} object; unknown keys are skipped, a repeated id or text
 * is refused (JSON parsers disagree on which copy wins). */
static int32_t json_special(json_cur *c, wt_special *sp, uint32_t n_base, uint32_t index)
{
    const uint8_t *obj_start = c->p;
    if (c->p >= c->end) return json_fail(c, "unexpected end of file");
    if (*c->p != '{') return json_fail(c, "expected an object");
    c->p++;
    int have_id = 0;
    int64_t id = 0;
    sp->text = NULL;
    int32_t st;
    char msg[128];
    json_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        goto check;
    }
    for (;;) {
        uint8_t *key = NULL;
        uint32_t key_len = 0;
        json_ws(c);
        if (c->p >= c->end || *c->p != '"') return json_fail(c, "expected a key");
        if ((st = json_string(c, &key, &key_len)) != WT_OK) return st;
        json_ws(c);
        if (c->p >= c->end || *c->p != ':') {
            free(key);
            return json_fail(c, "expected ':'");
        }
        c->p++;
        json_ws(c);
        if (key_len == 2 && memcmp(key, "id", 2) == 0) {
            int is_int = 0;
            free(key);
            if (have_id) return json_fail(c, "duplicate key \"id\"");
            if (c->p >= c->end || !(*c->p == '-' || (*c->p >= '0' && *c->p <= '9')))
                return json_fail(c, "\"id\" must be an integer");
            if ((st = json_number(c, &id, &is_int)) != WT_OK) return st;
            if (!is_int) return json_fail(c, "\"id\" must be an integer");
            have_id = 1;
        } else if (key_len == 4 && memcmp(key, "text", 4) == 0) {
            free(key);
            if (sp->text != NULL) return json_fail(c, "duplicate key \"text\"");
            if (c->p >= c->end || *c->p != '"') return json_fail(c, "\"text\" must be a string");
            if ((st = json_string(c, &sp->text, &sp->len)) != WT_OK) return st;
        } else {
            free(key);
            if ((st = json_skip_value(c, 1)) != WT_OK) return st;
        }
        json_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (c->p < c->end && *c->p == '}') {
            c->p++;
            break;
        }
        return json_fail(c, "expected ',' or '}'");
    }
check:;
    const uint8_t *after = c->p;
    c->p = obj_start; /* report errors at the start of the entry */
    if (!have_id || sp->text == NULL) {
        snprintf(msg, sizeof msg, "entry %u: needs \"id\" and \"text\"", index);
        return json_fail(c, msg);
    }
    if (sp->len == 0) {
        snprintf(msg, sizeof msg, "entry %u: empty \"text\"", index);
        return json_fail(c, msg);
    }
    if (id < (int64_t)n_base || id >= INT32_MAX) {
        snprintf(msg, sizeof msg, "entry %u: id %lld outside [n_base_vocab %u, 2^31-1)", index,
                 (long long)id, n_base);
        return json_fail(c, msg);
    }
    sp->id = (int32_t)id;
    c->p = after;
    return WT_OK;
}

static int cmp_special_id(const void *a, const void *b)
{
    int32_t x = ((const wt_special *)a)->id, y = ((const wt_special *)b)->id;
    return (x > y) - (x < y);
}

/* by_first order: first byte ascending, then longest first, then bytes (so equal texts
 * end up adjacent). */
static int cmp_by_first_len(const void *a, const void *b)
{
    const wt_special *x = *(const wt_special *const *)a, *y = *(const wt_special *const *)b;
    if (x->text[0] != y->text[0]) return x->text[0] < y->text[0] ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return memcmp(x->text, y->text, x->len);
}

static int32_t parse_specials(wt_tokenizer *t, const char *path, const uint8_t *data,
                              uint64_t size, char *err, uint64_t cap)
{
    json_cur c = {data, data, data + size, path, err, cap};
    json_ws(&c);
    if (c.p >= c.end || *c.p != '[') return json_fail(&c, "expected a JSON array");
    c.p++;
    uint32_t n = 0, alloc = 16;
    wt_special *sp = calloc(alloc, sizeof *sp);
    if (sp == NULL) return WT_E_NOMEM;
    t->specials = sp;
    json_ws(&c);
    if (c.p < c.end && *c.p == ']') {
        c.p++;
    } else {
        for (;;) {
            if (n == alloc) {
                if (alloc >= (1u << 24)) return json_fail(&c, "too many specials");
                wt_special *grown = realloc(sp, (size_t)alloc * 2 * sizeof *sp);
                if (grown == NULL) return WT_E_NOMEM;
                memset(grown + alloc, 0, (size_t)alloc * sizeof *sp);
                sp = t->specials = grown;
                alloc *= 2;
            }
            json_ws(&c);
            t->n_specials = n + 1; /* so free() releases a partly parsed entry's text */
            int32_t st = json_special(&c, &sp[n], t->n_base, n);
            if (st != WT_OK) return st;
            n++;
            json_ws(&c);
            if (c.p < c.end && *c.p == ',') {
                c.p++;
                continue;
            }
            if (c.p < c.end && *c.p == ']') {
                c.p++;
                break;
            }
            return json_fail(&c, "expected ',' or ']'");
        }
    }
    json_ws(&c);
    if (c.p != c.end) return json_fail(&c, "trailing data after the array");
    t->n_specials = n;

    /* Unique ids, then unique texts (adjacent once sorted for by_first). */
    qsort(sp, n, sizeof *sp, cmp_special_id);
    for (uint32_t i = 1; i < n; i++) {
        if (sp[i].id == sp[i - 1].id) {
            set_err(err, cap, "%s: duplicate special id %d", path, sp[i].id);
            return WT_E_FORMAT;
        }
    }
    if (n > 0 && (uint32_t)sp[n - 1].id + 1 > t->n_vocab) t->n_vocab = (uint32_t)sp[n - 1].id + 1;
    t->by_first = malloc(((size_t)n + 1) * sizeof *t->by_first);
    if (t->by_first == NULL) return WT_E_NOMEM;
    for (uint32_t i = 0; i < n; i++) t->by_first[i] = &sp[i];
    qsort(t->by_first, n, sizeof *t->by_first, cmp_by_first_len);
    for (uint32_t i = 1; i < n; i++) {
        const wt_special *x = t->by_first[i - 1], *y = t->by_first[i];
        if (x->len == y->len && memcmp(x->text, y->text, x->len) == 0) {
            set_err(err, cap, "%s: ids %d and %d have the same text", path,
                    x->id < y->id ? x->id : y->id, x->id < y->id ? y->id : x->id);
            return WT_E_FORMAT;
        }
    }
    uint32_t k = 0;
    for (uint32_t b = 0; b < 256; b++) {
        t->first_start[b] = k;
        while (k < n && t->by_first[k]->text[0] == b) k++;
    }
    t->first_start[256] = n;
    return WT_OK;
}

/* ======================================================================== load, free */

void wt_tokenizer_free(wt_tokenizer *t)
{
    if (t == NULL) return;
    for (uint32_t i = 0; i < t->n_specials; i++) free(t->specials[i].text);
    free(t->specials);
    free(t->by_first);
    free(t->bytes);
    free(t->offsets);
    free(t->slots);
    free(t);
}

int32_t wt_tokenizer_load(const char *ranks_path, const char *specials_path,
                          wt_tokenizer **out, char *err, uint64_t err_cap)
{
    if (err != NULL && err_cap > 0) err[0] = 0;
    if (out == NULL || ranks_path == NULL) {
        set_err(err, err_cap, "wt_tokenizer_load: NULL %s", out == NULL ? "out" : "ranks_path");
        return WT_E_ARG;
    }
    *out = NULL;
    wt_tokenizer *t = calloc(1, sizeof *t);
    if (t == NULL) return WT_E_NOMEM;
    uint8_t *data = NULL;
    uint64_t size = 0;
    int32_t st = read_file(ranks_path, &data, &size, err, err_cap);
    if (st == WT_OK) st = parse_ranks(t, ranks_path, data, size, err, err_cap);
    free(data);
    data = NULL;
    if (st == WT_OK) {
        t->n_vocab = t->n_base;
        for (uint32_t b = 0; b < 257; b++) t->first_start[b] = 0;
        if (specials_path != NULL) {
            st = read_file(specials_path, &data, &size, err, err_cap);
            if (st == WT_OK) st = parse_specials(t, specials_path, data, size, err, err_cap);
            free(data);
        }
    }
    if (st == WT_E_NOMEM) set_err(err, err_cap, "out of memory loading the tokenizer");
    if (st != WT_OK) {
        wt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return WT_OK;
}

/* ======================================================================== UTF-8 */

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when s does not start one. */
static unsigned utf8_decode(const uint8_t *s, uint64_t n, uint32_t *cp)
{
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    if (b0 < 0xC2) return 0;
    if (b0 < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(b0 & 0x1F) << 6 | (s[1] & 0x3F);
        return 2;
    }
    if (b0 < 0xF0) {
        uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
        if (n < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(b0 & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        return 3;
    }
    if (b0 < 0xF5) {
        uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
        if (n < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        *cp = (uint32_t)(b0 & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 |
              (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* ======================================================================== PAT scanner
 *
 * PAT (docs/ENGINE.md §7) is an alternation tried in order at each position, with
 * backtracking (Perl) semantics, as in tiktoken's fancy-regex. Every code point starts a
 * match of some branch (the generator checks it), so matches tile the text. Each branch
 * below reproduces the first match a backtracking engine finds; cp/fl index a chunk of n
 * code points, and the chunk end is the end of text for the lookahead.
 */

static uint64_t run_of(const uint8_t *fl, uint64_t i, uint64_t n, uint8_t bit)
{
    while (i < n && (fl[i] & bit)) i++;
    return i;
}

static int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)? at e: the alternatives start with different letters. */
static uint64_t contraction(const uint32_t *cp, uint64_t e, uint64_t n)
{
    if (e + 1 >= n || cp[e] != '\'') return e;
    uint32_t a = cp[e + 1];
    if (wt_cp_folds_to(a, 's') || wt_cp_folds_to(a, 't') || wt_cp_folds_to(a, 'm') ||
        wt_cp_folds_to(a, 'd'))
        return e + 2;
    if (e + 2 < n) {
        uint32_t b = cp[e + 2];
        if ((wt_cp_folds_to(a, 'r') || wt_cp_folds_to(a, 'v')) && wt_cp_folds_to(b, 'e'))
            return e + 3;
        if (wt_cp_folds_to(a, 'l') && wt_cp_folds_to(b, 'l')) return e + 3;
    }
    return e;
}

/* End of the match starting at i (always > i). */
static uint64_t pat_match(const uint32_t *cp, const uint8_t *fl, uint64_t i, uint64_t n)
{
    /* 1: [\p{Han}]+ */
    if (fl[i] & WT_CP_HAN) return run_of(fl, i, n, WT_CP_HAN);

    /* 2: P? U* LW+ C? — P? first taken then not; U* gives back one code point at a time
     * until LW+ can start (at the first non-U code point, or inside the U run where a
     * code point is both, e.g. Lo or M). */
    for (int with_p = 1; with_p >= 0; with_p--) {
        if (with_p && !(fl[i] & WT_CP_P)) continue;
        uint64_t j = i + (uint64_t)with_p;
        uint64_t k = run_of(fl, j, n, WT_CP_U);
        for (uint64_t m = k + 1; m-- > j;) {
            if (m < n && (fl[m] & WT_CP_LW))
                return contraction(cp, run_of(fl, m, n, WT_CP_LW), n);
        }
    }

    /* 3: P? U+ LW* C? */
    for (int with_p = 1; with_p >= 0; with_p--) {
        if (with_p && !(fl[i] & WT_CP_P)) continue;
        uint64_t j = i + (uint64_t)with_p;
        if (j < n && (fl[j] & WT_CP_U)) {
            uint64_t k = run_of(fl, j, n, WT_CP_U);
            return contraction(cp, run_of(fl, k, n, WT_CP_LW), n);
        }
    }

    /* 4: \p{N}{1,3} */
    if (fl[i] & WT_CP_N) {
        uint64_t e = i + 1;
        while (e < n && e - i < 3 && (fl[e] & WT_CP_N)) e++;
        return e;
    }

    /* 5: ' '?Q+[\r\n]* — a space is never in Q, so "with space" is the only way then. */
    {
        uint64_t j = cp[i] == ' ' && i + 1 < n && (fl[i + 1] & WT_CP_Q) ? i + 1 : i;
        if (fl[j] & WT_CP_Q) {
            uint64_t e = run_of(fl, j, n, WT_CP_Q);
            while (e < n && is_crlf(cp[e])) e++;
            return e;
        }
    }

    /* 6-8 all start with \s; cp[i] is whitespace here (coverage). */
    uint64_t k = run_of(fl, i, n, WT_CP_WS);
    /* 6: \s*[\r\n]+ — \s* backs off to the last CR/LF of the run, then [\r\n]+ takes it. */
    for (uint64_t m = k; m-- > i;) {
        if (is_crlf(cp[m])) return m + 1;
    }
    /* 7: \s+(?!\S) — the whole run at the end of text, else all but its last code point. */
    if (k == n) return k;
    if (k - i > 1) return k - 1;
    /* 8: \s+ */
    return k > i ? k : i + 1; /* i + 1 only if the tables were not generated as checked */
}

/* ======================================================================== BPE */

typedef struct {
    uint32_t rank, pos, ver;
} heap_entry;

typedef struct {
    /* One window of decoded code points: cp, byte offset (into the text), class flags. */
    uint32_t *cp;
    uint64_t *off; /* [n + 1] */
    uint8_t *fl;
    /* BPE workspace sized for the longest piece seen so far. */
    uint32_t *nxt, *prv, *ver;
    heap_entry *heap;
    uint64_t bpe_cap;
} scratch;

typedef struct {
    int32_t *out;
    uint64_t cap, n;
} sink;

static void emit(sink *s, uint32_t id)
{
    if (s->n < s->cap) s->out[s->n] = (int32_t)id;
    s->n++;
}

static int heap_less(heap_entry a, heap_entry b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_entry *h, uint64_t *n, heap_entry e)
{
    uint64_t i = (*n)++;
    while (i > 0) {
        uint64_t parent = (i - 1) / 2;
        if (!heap_less(e, h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, uint64_t *n)
{
    heap_entry top = h[0], last = h[--(*n)];
    uint64_t i = 0;
    for (;;) {
        uint64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static int32_t ensure_bpe(scratch *s, uint64_t n)
{
    if (n <= s->bpe_cap) return WT_OK;
    uint64_t cap = s->bpe_cap ? s->bpe_cap : 64;
    while (cap < n) cap *= 2;
    free(s->nxt);
    free(s->prv);
    free(s->ver);
    free(s->heap);
    s->nxt = malloc((size_t)cap * sizeof *s->nxt);
    s->prv = malloc((size_t)cap * sizeof *s->prv);
    s->ver = malloc((size_t)cap * sizeof *s->ver);
    /* n - 1 initial pairs plus at most two pushes per merge. */
    s->heap = malloc((size_t)cap * 3 * sizeof *s->heap);
    if (!s->nxt || !s->prv || !s->ver || !s->heap) {
        s->bpe_cap = 0;
        return WT_E_NOMEM;
    }
    s->bpe_cap = cap;
    return WT_OK;
}

/* Encodes one piece p[0, n): whole-piece lookup, else lowest-rank pair merging. Parts are
 * a linked list over byte positions; the heap holds (pair rank, left position, version)
 * and stale entries are skipped by version, so each merge is O(log n). Ranks are unique
 * per byte string, so ties only happen between equal strings and go to the leftmost,
 * exactly as tiktoken's linear scan. */
static int32_t bpe_piece(const wt_tokenizer *t, scratch *s, const uint8_t *p, uint64_t n,
                         sink *out)
{
    uint32_t whole = rank_of(t, p, n);
    if (whole != NO_RANK) {
        emit(out, whole);
        return WT_OK;
    }
    int32_t st = ensure_bpe(s, n);
    if (st != WT_OK) return st;
    uint32_t *nxt = s->nxt, *prv = s->prv, *ver = s->ver;
    heap_entry *heap = s->heap;
    uint64_t hn = 0;
    for (uint64_t i = 0; i < n; i++) {
        nxt[i] = (uint32_t)(i + 1);
        prv[i] = i == 0 ? NO_NODE : (uint32_t)(i - 1);
        ver[i] = 0;
    }
    for (uint64_t i = 0; i + 1 < n; i++) {
        uint32_t r = rank_of(t, p + i, 2);
        if (r != NO_RANK) heap_push(heap, &hn, (heap_entry){r, (uint32_t)i, 0});
    }
    while (hn > 0) {
        heap_entry e = heap_pop(heap, &hn);
        if (ver[e.pos] != e.ver) continue;
        uint32_t i = e.pos, j = nxt[i], k = nxt[j];
        nxt[i] = k;
        if (k < n) prv[k] = i;
        ver[j]++; /* j is gone: its entries are stale */
        ver[i]++;
        if (k < n) {
            uint32_t r = rank_of(t, p + i, (uint64_t)nxt[k] - i);
            if (r != NO_RANK) heap_push(heap, &hn, (heap_entry){r, i, ver[i]});
        }
        uint32_t h = prv[i];
        if (h != NO_NODE) {
            ver[h]++;
            uint32_t r = rank_of(t, p + h, (uint64_t)k - h);
            if (r != NO_RANK) heap_push(heap, &hn, (heap_entry){r, h, ver[h]});
        }
    }
    for (uint64_t i = 0; i < n; i = nxt[i]) {
        uint32_t r = rank_of(t, p + i, (uint64_t)nxt[i] - i);
        if (r == NO_RANK) return WT_E_FORMAT; /* unreachable: parts are ranks or bytes */
        emit(out, r);
    }
    return WT_OK;
}

/* ======================================================================== pipeline */

/* Plain text: code points [a, b) of the window, scanned as a text of its own. */
static int32_t encode_plain(const wt_tokenizer *t, scratch *s, const uint8_t *text,
                            uint64_t a, uint64_t b, sink *out)
{
    const uint32_t *cp = s->cp + a;
    const uint8_t *fl = s->fl + a;
    const uint64_t *off = s->off + a;
    uint64_t n = b - a;
    for (uint64_t i = 0; i < n;) {
        uint64_t e = pat_match(cp, fl, i, n);
        int32_t st = bpe_piece(t, s, text + off[i], off[e] - off[i], out);
        if (st != WT_OK) return st;
        i = e;
    }
    return WT_OK;
}

/* The longest special starting at byte position p (at most avail bytes), or NULL. */
static const wt_special *special_at(const wt_tokenizer *t, const uint8_t *p, uint64_t avail)
{
    uint32_t lo = t->first_start[p[0]], hi = t->first_start[p[0] + 1];
    for (uint32_t k = lo; k < hi; k++) {
        const wt_special *sp = t->by_first[k];
        if (sp->len <= avail && memcmp(sp->text, p, sp->len) == 0) return sp;
    }
    return NULL;
}

/* One pre-chunk [a, b): specials first (markup), the text between them plain. */
static int32_t encode_chunk(const wt_tokenizer *t, scratch *s, const uint8_t *text,
                            uint64_t a, uint64_t b, int32_t markup, sink *out)
{
    if (!markup || t->n_specials == 0) return encode_plain(t, s, text, a, b, out);
    uint64_t seg = a, end_byte = s->off[b];
    for (uint64_t i = a; i < b;) {
        const wt_special *sp = special_at(t, text + s->off[i], end_byte - s->off[i]);
        if (sp == NULL) {
            i++;
            continue;
        }
        int32_t st = encode_plain(t, s, text, seg, i, out);
        if (st != WT_OK) return st;
        emit(out, (uint32_t)sp->id);
        uint64_t stop = s->off[i] + sp->len; /* a code point boundary: sp is valid UTF-8 */
        while (i < b && s->off[i] < stop) i++;
        seg = i;
    }
    return encode_plain(t, s, text, seg, b, out);
}

/* Kimi's split of one window of n code points: no run of whitespace or non-whitespace
 * (str.isspace) longer than WT_MAX_RUN_CHARS; the same loop as the Python reference. */
static int32_t encode_window(const wt_tokenizer *t, scratch *s, const uint8_t *text,
                             uint64_t n, int32_t markup, sink *out)
{
    if (n == 0) return WT_OK;
    uint64_t slice_start = 0, run = 0;
    int is_space = (s->fl[0] & WT_CP_PYSPACE) != 0;
    for (uint64_t i = 0; i < n; i++) {
        int now = (s->fl[i] & WT_CP_PYSPACE) != 0;
        if (now != is_space) {
            run = 1;
            is_space = now;
        } else if (++run > WT_MAX_RUN_CHARS) {
            int32_t st = encode_chunk(t, s, text, slice_start, i, markup, out);
            if (st != WT_OK) return st;
            slice_start = i;
            run = 1;
        }
    }
    return encode_chunk(t, s, text, slice_start, n, markup, out);
}

static int32_t tokenize_all(const wt_tokenizer *t, scratch *s, const uint8_t *text,
                            uint64_t len, int32_t markup, sink *out)
{
    uint64_t window = len < WT_MAX_ENCODE_CHARS ? len : WT_MAX_ENCODE_CHARS;
    s->cp = malloc((size_t)(window + 1) * sizeof *s->cp);
    s->off = malloc((size_t)(window + 1) * sizeof *s->off);
    s->fl = malloc((size_t)(window + 1));
    if (!s->cp || !s->off || !s->fl) return WT_E_NOMEM;
    uint64_t pos = 0;
    while (pos < len) {
        /* A window: up to WT_MAX_ENCODE_CHARS code points (the text was validated). */
        uint64_t n = 0;
        uint32_t c;
        unsigned k;
        while (n < WT_MAX_ENCODE_CHARS && pos < len &&
               (k = utf8_decode(text + pos, len - pos, &c)) != 0) {
            s->cp[n] = c;
            s->off[n] = pos;
            s->fl[n] = wt_cp_flags(c);
            n++;
            pos += k;
        }
        if (n == 0) return WT_E_ARG; /* unreachable: wt_tokenize validated the text */
        s->off[n] = pos;
        int32_t st = encode_window(t, s, text, n, markup, out);
        if (st != WT_OK) return st;
    }
    return WT_OK;
}

uint64_t wt_utf8_invalid_at(const char *text, uint64_t len)
{
    const uint8_t *p = (const uint8_t *)text;
    uint32_t c;
    for (uint64_t pos = 0; pos < len;) {
        unsigned k = utf8_decode(p + pos, len - pos, &c);
        if (k == 0) return pos;
        pos += k;
    }
    return UINT64_MAX;
}

int32_t wt_tokenize(const wt_tokenizer *t, const char *text, uint64_t len, int32_t markup,
                    int32_t *out, uint64_t cap, uint64_t *n_out)
{
    if (n_out != NULL) *n_out = 0;
    if (t == NULL || n_out == NULL || (text == NULL && len > 0) || (out == NULL && cap > 0))
        return WT_E_ARG;
    if (wt_utf8_invalid_at(text, len) != UINT64_MAX) return WT_E_ARG;
    scratch s = {0};
    sink sk = {out, cap, 0};
    int32_t st = len > 0 ? tokenize_all(t, &s, (const uint8_t *)text, len, markup, &sk) : WT_OK;
    free(s.cp);
    free(s.off);
    free(s.fl);
    free(s.nxt);
    free(s.prv);
    free(s.ver);
    free(s.heap);
    if (st != WT_OK) return st;
    *n_out = sk.n;
    return sk.n > cap ? WT_E_SPACE : WT_OK;
}

/* ======================================================================== accessors */

int32_t wt_token_bytes(const wt_tokenizer *t, int32_t id, const uint8_t **bytes,
                       uint64_t *len)
{
    if (t == NULL || bytes == NULL || len == NULL || id < 0) return WT_E_ARG;
    if ((uint32_t)id < t->n_base) {
        *bytes = t->bytes + t->offsets[id];
        *len = t->offsets[id + 1] - t->offsets[id];
        return WT_OK;
    }
    uint32_t lo = 0, hi = t->n_specials;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->specials[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    if (lo == t->n_specials || t->specials[lo].id != id) return WT_E_ARG;
    *bytes = t->specials[lo].text;
    *len = t->specials[lo].len;
    return WT_OK;
}

uint32_t wt_n_base_vocab(const wt_tokenizer *t) { return t ? t->n_base : 0; }

uint32_t wt_n_vocab(const wt_tokenizer *t) { return t ? t->n_vocab : 0; }

int32_t wt_special_id(const wt_tokenizer *t, const char *text)
{
    if (t == NULL || text == NULL) return -1;
    size_t n = strlen(text);
    for (uint32_t i = 0; i < t->n_specials; i++)
        if (t->specials[i].len == n && memcmp(t->specials[i].text, text, n) == 0)
            return t->specials[i].id;
    return -1;
}
