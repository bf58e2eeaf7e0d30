/* tokenizer.h — Kimi's tiktoken-style BPE tokenizer (internal to libwaste).
 *
 * Loads `tokenizer.tiktoken` (one `base64(bytes) SP rank` per line; rank = id, dense,
 * unique, all 256 single bytes present) and optionally `specials.json`
 * (`[{"id": …, "text": …}]`, every id >= the number of ranks). Produces exactly the ids
 * of PyPI `tiktoken` with Kimi's pattern (PAT, docs/ENGINE.md §7) and Kimi's pre-chunking.
 *
 * Pipeline of wt_tokenize (the order matters for equality with the reference):
 *   1. UTF-8 validation. Text that is not valid UTF-8 (a truncated or overlong sequence,
 *      a surrogate, a code point above U+10FFFF, a stray continuation byte) is refused
 *      with WT_E_ARG before anything is produced; wt_utf8_invalid_at names the byte
 *      (docs/ENGINE.md §1 lists invalid UTF-8 under E_ARG). tiktoken cannot see such input
 *      either: a Python str holds none.
 *   2. Kimi's pre-chunking of each valid run: cut every 400,000 code points, then split
 *      each cut so that no run of whitespace or non-whitespace code points (Python's
 *      str.isspace, as in Kimi's reference) exceeds 25,000; each chunk is encoded alone.
 *   3. markup != 0 only: inside each chunk, special texts are found anywhere, the leftmost
 *      first and the longest at a position; the text between them is plain. A special
 *      that a chunk cut splits is plain text, as in the reference. Plain mode never
 *      produces an id >= wt_n_base_vocab.
 *   4. The PAT scanner (code-point classes from unicode_tables.h, probed from tiktoken's
 *      own regex engine) splits plain text into pieces.
 *   5. BPE per piece: the whole piece is looked up first; otherwise the adjacent pair whose
 *      concatenation has the lowest rank is merged (the leftmost on ties), repeatedly.
 *      A heap makes this O(n log n) in the piece length.
 *
 * Ownership: the tokenizer owns copies of everything it loaded; it is immutable after
 * wt_tokenizer_load, so concurrent wt_tokenize calls on one tokenizer are safe.
 * Status values are the libwaste ones, defined here privately with a WT_ prefix.
 */
#ifndef WASTE_TOKENIZER_H
#define WASTE_TOKENIZER_H

#include <stdint.h>

#define WT_OK 0
#define WT_E_IO (-1)      /* missing or unreadable file */
#define WT_E_FORMAT (-2)  /* bad rank line or specials entry; the detail names file and line */
#define WT_E_NOMEM (-4)
#define WT_E_ARG (-5)     /* NULL argument, id out of range, invalid UTF-8 */
#define WT_E_SPACE (-10)  /* output too small; *n_out = the number of ids needed */

/* The largest tokenizer.tiktoken / specials.json read (Kimi's rank file is ~2.8 MB). */
#define WT_MAX_FILE_BYTES (64u << 20)

/* Kimi's pre-chunking limits (code points). */
#define WT_MAX_ENCODE_CHARS 400000u
#define WT_MAX_RUN_CHARS 25000u

typedef struct wt_tokenizer wt_tokenizer;

/* Loads ranks (and specials when specials_path is not NULL). On failure *out is NULL and
 * err (err_cap bytes, always NUL-terminated when err_cap > 0) says what failed, naming
 * the file and line (E_FORMAT) or the file and the OS reason (E_IO). A file that is not a
 * regular file is E_IO; one above WT_MAX_FILE_BYTES is E_FORMAT. */
int32_t wt_tokenizer_load(const char *ranks_path, const char *specials_path,
                          wt_tokenizer **out, char *err, uint64_t err_cap);

/* NULL-safe. */
void wt_tokenizer_free(wt_tokenizer *t);

/* Tokenizes len bytes of text (need not be NUL-terminated; NULL allowed when len == 0).
 * Writes up to cap ids to out (NULL allowed when cap == 0) and always sets *n_out to the
 * total number of ids; returns WT_E_SPACE when that exceeds cap, WT_E_ARG (with *n_out 0)
 * when the text is not valid UTF-8. */
int32_t wt_tokenize(const wt_tokenizer *t, const char *text, uint64_t len, int32_t markup,
                    int32_t *out, uint64_t cap, uint64_t *n_out);

/* Offset of the first byte that does not start a valid UTF-8 sequence (see pipeline
 * step 1), or UINT64_MAX when all len bytes are valid UTF-8. */
uint64_t wt_utf8_invalid_at(const char *text, uint64_t len);

/* The bytes of one id (a special gives its text). Valid while t lives. WT_E_ARG for an id
 * that is negative, >= wt_n_vocab, or a gap between special ids. */
int32_t wt_token_bytes(const wt_tokenizer *t, int32_t id, const uint8_t **bytes,
                       uint64_t *len);

/* Number of ranks: ids below it are BPE tokens. */
uint32_t wt_n_base_vocab(const wt_tokenizer *t);

/* 1 + the largest id (rank or special). */
uint32_t wt_n_vocab(const wt_tokenizer *t);

/* The id of the special whose text is exactly `text` (NUL-terminated), or -1. */
int32_t wt_special_id(const wt_tokenizer *t, const char *text);

#endif
