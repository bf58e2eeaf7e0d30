/* hotlist.c — usage.waste (docs/FORMAT.md §8): per-(layer, expert) access counts merged
 * across runs. The file is a hint only: open never fails because of it (a bad header,
 * fingerprint or size ignores it whole, a bad entry is skipped, and usage_note says which),
 * while waste_save_usage reports every failure, naming the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "context.h"
#include "engine.h"

#define USAGE_MAGIC "WSTUSE01"
#define USAGE_VERSION 1
#define USAGE_HEADER 24
#define USAGE_ENTRY 16

/* ==== path ========================================================================= */
int32_t wh_set_path(waste_ctx *ctx, const char *cfg_path, char *err, uint64_t cap) {
    int n;
    if (cfg_path == NULL) n = snprintf(ctx->usage_path, sizeof ctx->usage_path, "%s/usage.waste", ctx->c.dir);
    else n = snprintf(ctx->usage_path, sizeof ctx->usage_path, "%s", cfg_path);
    if (n < 0 || (uint64_t)n >= sizeof ctx->usage_path) {
        wu_errf(err, cap, "cfg.usage_path: the path is longer than %u bytes", (unsigned)sizeof ctx->usage_path - 1);
        return WASTE_E_ARG;
    }
    return WASTE_OK;
}

/* ==== load ========================================================================= */
/* Key of (model layer, expert) in the counts, or -1 when the pair is not a routed expert. */
static int64_t entry_key(const waste_ctx *ctx, uint32_t layer, uint32_t expert) {
    if (layer >= ctx->c.cfg.n_layers || layer >= WC_MAX_LAYERS) return -1;
    int32_t bank = ctx->c.bank_of_layer[layer];
    if (bank < 0 || expert >= ctx->cache.n_experts) return -1;
    return (int64_t)((uint64_t)bank * ctx->cache.n_experts + expert);
}

/* The path's last 96 bytes: the note (160 bytes) must keep the file name and the reason. */
static const char *path_tail(const waste_ctx *ctx) {
    size_t n = strlen(ctx->usage_path);
    return n > 96 ? ctx->usage_path + n - 96 : ctx->usage_path;
}

static void ignore(waste_ctx *ctx, const char *why) {
    snprintf(ctx->usage_note, sizeof ctx->usage_note, "%s%.96s ignored: %.40s", strlen(ctx->usage_path) > 96 ? "..." : "",
             path_tail(ctx), why);
}

void wh_load(waste_ctx *ctx) {
    ctx->usage_note[0] = 0;
    if (!ctx->usage_path[0] || ctx->cache.n_all == 0) return;
    int fd;
    uint64_t size = 0;
    int o = wu_open_regular(ctx->usage_path, 0, &fd, &size);   /* a FIFO must not block open */
    if (o == -2) { ignore(ctx, "not a regular file"); return; }
    if (o) {
        if (errno != ENOENT) ignore(ctx, strerror(errno));
        return;     /* no hotlist yet: the common first run */
    }
    uint8_t h[USAGE_HEADER];
    if (wu_pread_full(fd, h, USAGE_HEADER, 0) != 0) { ignore(ctx, "shorter than its 24-byte header"); close(fd); return; }
    uint64_t n = wu_read_u32le(h + 12);
    if (memcmp(h, USAGE_MAGIC, 8) != 0) { ignore(ctx, "bad magic"); close(fd); return; }
    if (wu_read_u32le(h + 8) != USAGE_VERSION) { ignore(ctx, "unsupported version"); close(fd); return; }
    if (wu_read_u64le(h + 16) != ctx->c.fingerprint) { ignore(ctx, "fingerprint of another manifest"); close(fd); return; }
    /* A file we wrote has at most one entry per routed expert; more is not ours to trust. */
    if (n > ctx->cache.n_all) { ignore(ctx, "more entries than the model has experts"); close(fd); return; }
    if (size != USAGE_HEADER + n * USAGE_ENTRY) { ignore(ctx, "size disagrees with n_entries (truncated?)"); close(fd); return; }
    uint64_t bytes = n * USAGE_ENTRY;
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) { ignore(ctx, "out of memory reading it"); close(fd); return; }
    wx_mem_add(ctx, bytes);
    int r = bytes ? wu_pread_full(fd, buf, bytes, USAGE_HEADER) : 0;
    close(fd);
    if (r != 0) ignore(ctx, "read failed");
    else {
        /* Validated whole: merge (saturating), skipping entries that name no routed expert. */
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *p = buf + i * USAGE_ENTRY;
            int64_t key = entry_key(ctx, wu_read_u32le(p), wu_read_u32le(p + 4));
            uint64_t count = wu_read_u64le(p + 8);
            if (key < 0 || count == 0) { ctx->usage_skipped++; continue; }
            uint64_t *dst = &ctx->cache.counts[key];
            *dst = UINT64_MAX - *dst < count ? UINT64_MAX : *dst + count;
            ctx->usage_entries++;
        }
        if (ctx->usage_skipped)
            snprintf(ctx->usage_note, sizeof ctx->usage_note, "%s%.96s: skipped %llu bad entries",
                     strlen(ctx->usage_path) > 96 ? "..." : "", path_tail(ctx), (unsigned long long)ctx->usage_skipped);
    }
    free(buf);
    wx_mem_sub(ctx, bytes);
}

/* ==== save ========================================================================= */
static int write_all(int fd, const uint8_t *p, uint64_t n) {
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 20) ? (1u << 20) : (size_t)n);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        p += w; n -= (uint64_t)w;
    }
    return 0;
}

int32_t wh_save(waste_ctx *ctx, const char *path) {
    const we_cache *c = &ctx->cache;
    uint64_t n = 0;
    for (uint64_t k = 0; k < c->n_all; k++) n += c->counts[k] > 0;
    char tmp[1200];
    int tl = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%llx", path, (long)getpid(), (unsigned long long)(uintptr_t)ctx);
    if (tl < 0 || (uint64_t)tl >= sizeof tmp) { wx_err(ctx, "%s: path too long for the temporary file", path); return WASTE_E_ARG; }
    /* O_NONBLOCK: a FIFO squatting on the name fails (ENXIO) instead of waiting for a reader. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0) { wx_err(ctx, "%s: cannot create the temporary file %s: %s", path, tmp, strerror(errno)); return WASTE_E_IO; }
    struct stat tst;
    if (fstat(fd, &tst) != 0 || !S_ISREG(tst.st_mode)) {
        close(fd);
        wx_err(ctx, "%s: the temporary file %s is not a regular file", path, tmp);
        return WASTE_E_IO;
    }
    uint8_t buf[USAGE_HEADER + 1024 * USAGE_ENTRY];
    memcpy(buf, USAGE_MAGIC, 8);
    wu_write_u32le(buf + 8, USAGE_VERSION);
    wu_write_u32le(buf + 12, (uint32_t)n);      /* n <= n_all, which fits u32 (layers x experts) */
    wu_write_u64le(buf + 16, ctx->c.fingerprint);
    uint64_t at = USAGE_HEADER;
    int bad = 0;
    /* Ascending (layer, expert): banks are in layer order, so key order is that order. */
    for (uint64_t k = 0; k < c->n_all && !bad; k++) {
        if (!c->counts[k]) continue;
        uint8_t *p = buf + at;
        wu_write_u32le(p, ctx->c.banks[k / c->n_experts].layer);
        wu_write_u32le(p + 4, (uint32_t)(k % c->n_experts));
        wu_write_u64le(p + 8, c->counts[k]);
        at += USAGE_ENTRY;
        if (at == sizeof buf) { bad = write_all(fd, buf, at); at = 0; }
    }
    if (!bad && at) bad = write_all(fd, buf, at);
    if (!bad) bad = fsync(fd);
    int saved = errno;
    if (close(fd) != 0 && !bad) { bad = 1; saved = errno; }
    if (bad) {
        unlink(tmp);
        wx_err(ctx, "%s: writing the temporary file %s failed: %s", path, tmp, strerror(saved));
        return WASTE_E_IO;
    }
    if (rename(tmp, path) != 0) {
        saved = errno;
        unlink(tmp);
        wx_err(ctx, "%s: cannot rename %s over it: %s", path, tmp, strerror(saved));
        return WASTE_E_IO;
    }
    return WASTE_OK;
}
