/* json.c — a small bounded JSON parser for manifests, which are untrusted.
 *
 * Builds a DOM in one arena. Limits: nesting depth 16, strings 4096 bytes, 2^20 values;
 * any violation is E_FORMAT with the byte offset. Strings must be UTF-8 and are unescaped
 * (\uXXXX with surrogate pairs to UTF-8); an object may not repeat a key; numbers go
 * through strtod on a bounded copy, in the C locale (uselocale for the parse, so a host's
 * setlocale(LC_NUMERIC, "de_DE.UTF-8") does not turn "1e-05" or "2.446" into errors).
 */
#include <limits.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define WJ_MAX_DEPTH 16
#define WJ_MAX_STR 4096
#define WJ_MAX_VALUES (1u << 20)

struct wj_doc {
    wj_val *vals;
    uint32_t n_vals, cap_vals;
    char *strs;            /* string arena: at most len+1 bytes of unescaped text */
    uint64_t n_strs, cap_strs;
    wj_val *root;
};

typedef struct {
    const char *s;
    uint64_t len, pos;
    wj_doc *d;
    char *err;
    uint64_t cap;
} wj_parser;

static int fail(wj_parser *p, const char *what) {
    wu_errf(p->err, p->cap, "manifest.json: %s at byte %llu", what, (unsigned long long)p->pos);
    return WASTE_E_FORMAT;
}

static void skip_ws(wj_parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->pos++; else break;
    }
}

static wj_val *new_val(wj_parser *p) {
    if (p->d->n_vals >= p->d->cap_vals) return NULL;
    wj_val *v = &p->d->vals[p->d->n_vals++];
    memset(v, 0, sizeof *v);
    return v;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(wj_parser *p, uint32_t *out) {
    if (p->pos + 4 > p->len) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[p->pos + i]);
        if (h < 0) return 0;
        v = v * 16 + (uint32_t)h;
    }
    p->pos += 4; *out = v; return 1;
}

/* Length of the valid UTF-8 sequence at s[0..n) (2-4 bytes, s[0] >= 0x80), or 0. */
static unsigned utf8_len(const unsigned char *s, uint64_t n) {
    unsigned char b = s[0];
    unsigned need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (need == 0 || n < need) return 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b == 0xE0) lo = 0xA0; else if (b == 0xED) hi = 0x9F; else if (b == 0xF0) lo = 0x90; else if (b == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (unsigned i = 2; i < need; i++) if ((s[i] & 0xC0) != 0x80) return 0;
    return need;
}

static int parse_string(wj_parser *p, const char **out, uint32_t *out_len) {
    /* p->s[p->pos] == '"' */
    p->pos++;
    char *dst = p->d->strs + p->d->n_strs;
    uint64_t n = 0;
    while (1) {
        if (p->pos >= p->len) return fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return fail(p, "control character in string");
        if (n + 4 > WJ_MAX_STR) return fail(p, "string longer than 4096 bytes");
        if (c >= 0x80) {   /* JSON text is UTF-8 (RFC 8259): details never echo other bytes */
            unsigned k = utf8_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
            if (k == 0) return fail(p, "invalid UTF-8 in a string");
            memcpy(dst + n, p->s + p->pos, k); n += k; p->pos += k;
            continue;
        }
        if (c != '\\') { dst[n++] = (char)c; p->pos++; continue; }
        p->pos++;
        if (p->pos >= p->len) return fail(p, "unterminated escape");
        char e = p->s[p->pos++];
        switch (e) {
        case '"': dst[n++] = '"'; break;
        case '\\': dst[n++] = '\\'; break;
        case '/': dst[n++] = '/'; break;
        case 'b': dst[n++] = '\b'; break;
        case 'f': dst[n++] = '\f'; break;
        case 'n': dst[n++] = '\n'; break;
        case 'r': dst[n++] = '\r'; break;
        case 't': dst[n++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!read_hex4(p, &cp)) return fail(p, "bad \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->pos + 2 > p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return fail(p, "lone surrogate");
                p->pos += 2;
                if (!read_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) return fail(p, "bad surrogate pair");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return fail(p, "lone surrogate");
            }
            if (cp < 0x80) dst[n++] = (char)cp;
            else if (cp < 0x800) { dst[n++] = (char)(0xC0 | (cp >> 6)); dst[n++] = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                dst[n++] = (char)(0xE0 | (cp >> 12)); dst[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                dst[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                dst[n++] = (char)(0xF0 | (cp >> 18)); dst[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                dst[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)); dst[n++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: return fail(p, "bad escape");
        }
    }
    if (memchr(dst, 0, n)) return fail(p, "NUL in string");
    dst[n] = 0;
    p->d->n_strs += n + 1;
    *out = dst; *out_len = (uint32_t)n;
    return 0;
}

static int parse_value(wj_parser *p, wj_val **out, int depth);

static int parse_number(wj_parser *p, wj_val *v) {
    uint64_t start = p->pos;
    int is_int = 1;
    if (p->pos < p->len && p->s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len || !(p->s[p->pos] >= '0' && p->s[p->pos] <= '9')) return fail(p, "bad number");
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c >= '0' && c <= '9') p->pos++;
        else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { is_int = 0; p->pos++; }
        else break;
    }
    uint64_t n = p->pos - start;
    if (n > 64) return fail(p, "number too long");
    char buf[72]; memcpy(buf, p->s + start, n); buf[n] = 0;
    char *end = NULL;
    v->type = WJ_NUM;
    v->num = strtod(buf, &end);
    if (end != buf + n) return fail(p, "bad number");
    if (is_int) {
        char *e2 = NULL;
        long long ll = strtoll(buf, &e2, 10);
        if (e2 == buf + n && !(ll == LLONG_MAX || ll == LLONG_MIN)) { v->is_int = 1; v->i = ll; }
    }
    return 0;
}

static int key_order(const void *a, const void *b) {
    return strcmp((*(const wj_val *const *)a)->key, (*(const wj_val *const *)b)->key);
}

/* Duplicate keys are refused: parsers disagree on which one wins (this one would keep the
 * first, Python's json the last), so a manifest must not depend on it. */
static int check_keys(wj_parser *p, const wj_val *obj, uint64_t at) {
    uint32_t n = obj->n_children;
    if (n < 2) return 0;
    const wj_val *dup = NULL;
    if (n <= 16) {
        for (const wj_val *a = obj->child; a && !dup; a = a->next)
            for (const wj_val *b = a->next; b; b = b->next) if (!strcmp(a->key, b->key)) { dup = a; break; }
    } else {
        const wj_val **v = malloc((size_t)n * sizeof *v);
        if (!v) { wu_errf(p->err, p->cap, "out of memory parsing manifest.json"); return WASTE_E_NOMEM; }
        uint32_t i = 0;
        for (const wj_val *a = obj->child; a; a = a->next) v[i++] = a;
        qsort(v, n, sizeof *v, key_order);
        for (i = 1; i < n && !dup; i++) if (!strcmp(v[i - 1]->key, v[i]->key)) dup = v[i];
        free(v);
    }
    if (!dup) return 0;
    wu_errf(p->err, p->cap, "manifest.json: duplicate key \"%.200s\" in the object at byte %llu", dup->key, (unsigned long long)at);
    return WASTE_E_FORMAT;
}

static int parse_container(wj_parser *p, wj_val *v, int depth, int is_obj) {
    char close = is_obj ? '}' : ']';
    uint64_t start = p->pos;
    v->type = is_obj ? WJ_OBJ : WJ_ARR;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; return 0; }
    wj_val *last = NULL;
    while (1) {
        skip_ws(p);
        const char *key = NULL; uint32_t klen = 0;
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a key");
            int st = parse_string(p, &key, &klen);
            if (st) return st;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "expected ':'");
            p->pos++;
        }
        wj_val *child = NULL;
        int st = parse_value(p, &child, depth + 1);
        if (st) return st;
        child->key = key;
        if (last) last->next = child; else v->child = child;
        last = child;
        v->n_children++;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "unterminated container");
        if (p->s[p->pos] == ',') { p->pos++; continue; }
        if (p->s[p->pos] == close) { p->pos++; return is_obj ? check_keys(p, v, start) : 0; }
        return fail(p, "expected ',' or a closing bracket");
    }
}

static int parse_value(wj_parser *p, wj_val **out, int depth) {
    if (depth > WJ_MAX_DEPTH) return fail(p, "nesting deeper than 16");
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "unexpected end");
    wj_val *v = new_val(p);
    if (!v) return fail(p, "more than 2^20 values");
    *out = v;
    char c = p->s[p->pos];
    if (c == '{') return parse_container(p, v, depth, 1);
    if (c == '[') return parse_container(p, v, depth, 0);
    if (c == '"') { v->type = WJ_STR; return parse_string(p, &v->str, &v->str_len); }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, v);
    if (p->len - p->pos >= 4 && !memcmp(p->s + p->pos, "true", 4)) { v->type = WJ_BOOL; v->num = 1; p->pos += 4; return 0; }
    if (p->len - p->pos >= 5 && !memcmp(p->s + p->pos, "false", 5)) { v->type = WJ_BOOL; p->pos += 5; return 0; }
    if (p->len - p->pos >= 4 && !memcmp(p->s + p->pos, "null", 4)) { v->type = WJ_NULL; p->pos += 4; return 0; }
    return fail(p, "unexpected character");
}

int32_t wj_parse(const char *text, uint64_t len, wj_doc **out, char *err, uint64_t cap) {
    *out = NULL;
    wj_doc *d = calloc(1, sizeof *d);
    if (!d) { wu_errf(err, cap, "out of memory parsing manifest.json"); return WASTE_E_NOMEM; }
    /* A value needs at least one byte of input, so len+1 bounds the count. */
    uint64_t cap_vals = len + 1 < WJ_MAX_VALUES ? len + 1 : WJ_MAX_VALUES;
    d->vals = calloc((size_t)cap_vals, sizeof(wj_val));
    d->strs = malloc((size_t)len + 1);
    if (!d->vals || !d->strs) { wj_free(d); wu_errf(err, cap, "out of memory parsing manifest.json"); return WASTE_E_NOMEM; }
    d->cap_vals = (uint32_t)cap_vals;
    d->cap_strs = len + 1;
    wj_parser p = {text, len, 0, d, err, cap};
    locale_t c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (c_numeric == (locale_t)0) { wj_free(d); wu_errf(err, cap, "out of memory parsing manifest.json (C locale)"); return WASTE_E_NOMEM; }
    locale_t caller = uselocale(c_numeric);   /* this thread only; restored below */
    int st = parse_value(&p, &d->root, 0);
    uselocale(caller);
    freelocale(c_numeric);
    if (!st) {
        skip_ws(&p);
        if (p.pos != p.len) st = fail(&p, "trailing bytes after the document");
    }
    if (st) { wj_free(d); return st; }
    *out = d;
    return WASTE_OK;
}

const wj_val *wj_root(const wj_doc *d) { return d->root; }

void wj_free(wj_doc *d) {
    if (!d) return;
    free(d->vals); free(d->strs); free(d);
}

const wj_val *wj_get(const wj_val *obj, const char *key) {
    if (!obj || obj->type != WJ_OBJ) return NULL;
    for (const wj_val *c = obj->child; c; c = c->next)
        if (!strcmp(c->key, key)) return c;
    return NULL;
}

const wj_val *wj_at(const wj_val *arr, uint32_t i) {
    if (!arr || arr->type != WJ_ARR) return NULL;
    const wj_val *c = arr->child;
    while (c && i--) c = c->next;
    return c;
}
