/* util.c — small shared helpers: crc32 (IEEE), FNV-1a, fp16/bf16 decoding, errors,
 * overflow-checked arithmetic, exact preads and the monotonic clock. */
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ==== crc32 IEEE, reflected 0xEDB88320 ============================================ */
/* Generated from the polynomial; a constant table keeps the library free of mutable globals. */
static const uint32_t crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu, 0xe963a535u, 0x9e6495a3u,
    0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u, 0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u,
    0x1db71064u, 0x6ab020f2u, 0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u, 0xfa0f3d63u, 0x8d080df5u,
    0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u, 0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu,
    0x35b5a8fau, 0x42b2986cu, 0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u, 0xcfba9599u, 0xb8bda50fu,
    0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u, 0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du,
    0x76dc4190u, 0x01db7106u, 0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du, 0x91646c97u, 0xe6635c01u,
    0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu, 0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u,
    0x65b0d9c6u, 0x12b7e950u, 0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u, 0xa4d1c46du, 0xd3d6f4fbu,
    0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u, 0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u,
    0x5005713cu, 0x270241aau, 0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u, 0xb7bd5c3bu, 0xc0ba6cadu,
    0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au, 0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u,
    0xe3630b12u, 0x94643b84u, 0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu, 0x196c3671u, 0x6e6b06e7u,
    0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu, 0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u,
    0xd6d6a3e8u, 0xa1d1937eu, 0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u, 0x316e8eefu, 0x4669be79u,
    0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u, 0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu,
    0xc5ba3bbeu, 0xb2bd0b28u, 0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu, 0x72076785u, 0x05005713u,
    0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u, 0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u,
    0x86d3d2d4u, 0xf1d4e242u, 0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u, 0x616bffd3u, 0x166ccf45u,
    0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u, 0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu,
    0xaed16a4au, 0xd9d65adcu, 0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u, 0x54de5729u, 0x23d967bfu,
    0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u, 0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

uint32_t wu_crc32_update(uint32_t crc, const void *data, uint64_t len) {
    const uint8_t *p = data;
    for (uint64_t i = 0; i < len; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc;
}

uint32_t wu_crc32(const void *data, uint64_t len) {
    return wu_crc32_update(0xFFFFFFFFu, data, len) ^ 0xFFFFFFFFu;
}

uint64_t wu_fnv1a64(const void *data, uint64_t len) {
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < len; i++) { h ^= p[i]; h *= 0x100000001b3ull; }
    return h;
}

/* ==== number formats =============================================================== */
float wu_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) { bits = sign; }
        else { /* subnormal: kept, scaled exactly */
            float f = (float)man * (1.0f / 16777216.0f); /* man * 2^-24 */
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f; memcpy(&f, &bits, 4); return f;
}

float wu_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16; float f; memcpy(&f, &bits, 4); return f;
}

uint64_t wu_read_u64le(const uint8_t *p) {
    uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v;
}
uint32_t wu_read_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
void wu_write_u64le(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
void wu_write_u32le(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* ==== errors, arithmetic, I/O ======================================================= */
/* Length of the valid UTF-8 sequence at s (1-4), or 0 when s does not start one. */
static unsigned utf8_seq(const unsigned char *s) {
    unsigned char b = s[0];
    if (b < 0x80) return 1;
    unsigned need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (need == 0) return 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b == 0xE0) lo = 0xA0; else if (b == 0xED) hi = 0x9F; else if (b == 0xF0) lo = 0x90; else if (b == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;               /* also stops at the NUL */
    for (unsigned i = 2; i < need; i++) if ((s[i] & 0xC0) != 0x80) return 0;
    return need;
}

void wu_sanitize(char *err, uint64_t cap) {
    if (!err || cap == 0) return;
    const unsigned char *p = (const unsigned char *)err;
    uint64_t i = 0;
    while (p[i] && utf8_seq(p + i)) i += utf8_seq(p + i);
    if (!p[i]) return;                                   /* already valid UTF-8: the usual case */
    char out[2048];
    uint64_t lim = cap < sizeof out ? cap : sizeof out, o = 0;
    memcpy(out, err, (size_t)(i < lim ? i : lim - 1));
    o = i < lim ? i : lim - 1;
    while (p[i] && o + 1 < lim) {
        unsigned k = utf8_seq(p + i);
        if (k) {
            if (o + k >= lim) break;
            memcpy(out + o, p + i, k); o += k; i += k;
        } else {
            if (o + 4 >= lim) break;
            snprintf(out + o, 5, "\\x%02X", p[i]); o += 4; i++;
        }
    }
    out[o] = 0;
    memcpy(err, out, (size_t)o + 1);
}

void wu_vformat(char *err, uint64_t cap, const char *fmt, va_list ap) {
    if (!err || cap == 0) return;
    /* Details read the same whatever the host's LC_NUMERIC ("2.446", never "2,446"): the
     * C locale for this thread while formatting. */
    locale_t c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    locale_t caller = c_numeric ? uselocale(c_numeric) : (locale_t)0;
    vsnprintf(err, cap > 0x7fffffff ? 0x7fffffff : (size_t)cap, fmt, ap);
    if (c_numeric) { uselocale(caller); freelocale(c_numeric); }
    wu_sanitize(err, cap);
}

void wu_errf(char *err, uint64_t cap, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    wu_vformat(err, cap, fmt, ap);
    va_end(ap);
}

int wu_mul(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *out = a * b; return 1;
}
int wu_add(uint64_t a, uint64_t b, uint64_t *out) {
    if (b > UINT64_MAX - a) return 0;
    *out = a + b; return 1;
}

int wu_open_regular(const char *path, int extra_flags, int *fd_out, uint64_t *size) {
    *fd_out = -1;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) { int e = errno; close(fd); errno = e; return -1; }
    if (!S_ISREG(st.st_mode)) { close(fd); return -2; }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) { int e = errno; close(fd); errno = e; return -1; }
    *fd_out = fd;
    if (size) *size = (uint64_t)st.st_size;
    return 0;
}

int wu_pread_full(int fd, void *buf, uint64_t len, uint64_t off) {
    uint8_t *p = buf;
    while (len > 0) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        if (r == 0) return -2;
        p += r; off += (uint64_t)r; len -= (uint64_t)r;
    }
    return 0;
}

/* Zeroed memory aligned to `align`; with huge, advised for transparent huge pages before any
 * page is touched (the zeroing touches them all). */
static void *zeroed_aligned(uint64_t align, uint64_t size, int huge) {
    if (size == 0) size = align;
    void *p = NULL;
    if (size > SIZE_MAX || posix_memalign(&p, (size_t)align, (size_t)size) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (huge) madvise(p, (size_t)size, MADV_HUGEPAGE);   /* a hint: refused or unsupported leaves 4 KiB pages */
#else
    (void)huge;
#endif
    memset(p, 0, (size_t)size);
    return p;
}

void *wu_aligned_alloc(uint64_t align, uint64_t size) { return zeroed_aligned(align, size, 0); }

void *wu_huge_alloc(uint64_t size) { return zeroed_aligned(2ull << 20, size, 1); }

double wu_now_ms(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ==== weight formats ================================================================ */
const char *wf_name(int32_t fmt) {
    switch (fmt) {
    case WF_F32: return "f32"; case WF_BF16: return "bf16"; case WF_INT8: return "int8";
    case WF_INT4: return "int4"; case WF_MXFP4: return "mxfp4"; default: return "?";
    }
}
int32_t wf_parse(const char *s) {
    if (!strcmp(s, "f32")) return WF_F32;
    if (!strcmp(s, "bf16")) return WF_BF16;
    if (!strcmp(s, "int8")) return WF_INT8;
    if (!strcmp(s, "int4")) return WF_INT4;
    if (!strcmp(s, "mxfp4")) return WF_MXFP4;
    return -1;
}
uint64_t wf_row_bytes(int32_t fmt, uint32_t group, uint64_t cols) {
    switch (fmt) {
    case WF_F32: return cols * 4;
    case WF_BF16: return cols * 2;
    case WF_INT8: if ((group != 32 && group != 128) || cols % group) return 0;
        return cols / group * (2 + group);
    case WF_INT4: if ((group != 32 && group != 128) || cols % group) return 0;
        return cols / group * (2 + group / 2);
    case WF_MXFP4: if (group != 32 || cols % 32) return 0;
        return cols / 32 * 17;
    default: return 0;
    }
}
