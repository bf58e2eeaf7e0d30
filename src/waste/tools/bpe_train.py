"""Deterministic byte-level BPE training for synthetic tiktoken rank files.

Used by the tokenizer tests and by tools that build synthetic containers. Pure stdlib: the
split pattern's Rust-regex classes (``\\p{..}``, ``\\s``, ``&&``) are expanded into explicit
Python ``re`` classes computed from :mod:`unicodedata`.
"""

from __future__ import annotations

import base64
import functools
import heapq
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

# Kimi's pre-tokenizer pattern (docs/ENGINE.md §7): eight branches joined by "|".
KIMI_PAT = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

_MAX_CP = 0x110000
# Rust's \s is the White_Space property (Python's str.isspace also has U+001C..U+001F).
_WHITE_SPACE = [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
# unicodedata has no Script property: Han is approximated by these name prefixes (the
# ideographs, radicals and ideographic marks). This only shapes which merges are learned;
# the C tokenizer's own tables are probed from tiktoken.
_HAN_NAME_PREFIXES = ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH", "CJK RADICAL",
                      "KANGXI RADICAL", "IDEOGRAPHIC ITERATION", "IDEOGRAPHIC CLOSING",
                      "IDEOGRAPHIC NUMBER", "HANGZHOU NUMERAL")


# ------------------------------------------------------------------ pattern translation


def _mask_of(cps) -> int:
    bits = bytearray(_MAX_CP // 8)
    for cp in cps:
        bits[cp >> 3] |= 1 << (cp & 7)
    return int.from_bytes(bits, "little")


_ALL = (1 << _MAX_CP) - 1


@functools.lru_cache(maxsize=None)
def _category_masks() -> dict[str, int]:
    by_cat: dict[str, list[int]] = defaultdict(list)
    han: list[int] = []
    for cp in range(_MAX_CP):
        cat = unicodedata.category(chr(cp))
        by_cat[cat].append(cp)
        if cat in ("Lo", "Lm", "Nl", "So") and unicodedata.name(chr(cp), "").startswith(
            _HAN_NAME_PREFIXES
        ):
            han.append(cp)
    masks = {cat: _mask_of(cps) for cat, cps in by_cat.items()}
    for major in "LMNPSZC":
        masks[major] = 0
        for cat, mask in list(masks.items()):
            if len(cat) == 2 and cat[0] == major:
                masks[major] |= mask
    masks["Han"] = _mask_of(han)
    return masks


def _property_mask(name: str) -> int:
    masks = _category_masks()
    if name not in masks:
        raise ValueError(f"unsupported \\p{{{name}}} in the split pattern")
    return masks[name]


def _escape_mask(pat: str, i: int) -> tuple[int | None, int]:
    """Parses the escape at pat[i] == '\\'; returns (mask or None if literal, next index)."""
    kind = pat[i + 1]
    if kind in "pP":
        if pat[i + 2] == "{":
            close = pat.index("}", i + 3)
            name, end = pat[i + 3 : close], close + 1
        else:
            name, end = pat[i + 2], i + 3
        mask = _property_mask(name)
        return (mask if kind == "p" else _ALL ^ mask), end
    if kind in "sS":
        mask = _mask_of(_WHITE_SPACE)
        return (mask if kind == "s" else _ALL ^ mask), i + 2
    if kind in "dD":
        mask = _property_mask("Nd")
        return (mask if kind == "d" else _ALL ^ mask), i + 2
    return None, i + 2


_LITERAL_ESCAPES = {"r": "\r", "n": "\n", "t": "\t", "f": "\f", "v": "\v"}


def _class_mask(pat: str, i: int) -> tuple[int, int]:
    """Parses a bracket class at pat[i] == '['; returns (mask, next index)."""
    i += 1
    negate = pat[i] == "^"
    if negate:
        i += 1
    operands: list[int] = []
    acc = 0
    first = True
    while True:
        c = pat[i]
        if c == "]" and not first:
            i += 1
            break
        first = False
        if pat.startswith("&&", i):
            operands.append(acc)
            acc = 0
            i += 2
            continue
        if c == "[":
            mask, i = _class_mask(pat, i)
            acc |= mask
            continue
        if c == "\\":
            escaped, j = _escape_mask(pat, i)
            if escaped is not None:
                acc |= escaped
                i = j
                continue
            lo = ord(_LITERAL_ESCAPES.get(pat[i + 1], pat[i + 1]))
            i = j
        else:
            lo = ord(c)
            i += 1
        hi = lo
        if pat[i] == "-" and pat[i + 1] != "]":
            hi_char = pat[i + 1]
            if hi_char == "\\":
                hi = ord(_LITERAL_ESCAPES.get(pat[i + 2], pat[i + 2]))
                i += 3
            else:
                hi = ord(hi_char)
                i += 2
        acc |= ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)
    operands.append(acc)
    mask = functools.reduce(lambda a, b: a & b, operands)
    return (_ALL ^ mask if negate else mask), i


def _mask_to_re(mask: int) -> str:
    negate = bin(mask).count("1") > _MAX_CP // 2
    if negate:
        mask ^= _ALL
    bits = format(mask, f"0{_MAX_CP}b")[::-1]
    parts = []
    for m in re.finditer("1+", bits):
        lo, hi = m.start(), m.end() - 1
        parts.append(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}")
    if not parts:
        return "[^\\x00-\\U0010ffff]" if not negate else "[\\x00-\\U0010ffff]"
    return ("[^" if negate else "[") + "".join(parts) + "]"


@functools.lru_cache(maxsize=8)
def compile_pattern(pat: str) -> re.Pattern[str]:
    """Translates a tiktoken (Rust regex) split pattern into a compiled Python pattern.

    Supports what Kimi's, cl100k's and o200k's patterns use: ``\\p{..}``/``\\P{..}`` with
    general categories and ``Han``, ``\\s``/``\\S``/``\\d``, nested bracket classes with
    ``&&`` intersection; groups, quantifiers and lookarounds pass through unchanged.

    Args:
        pat: The pattern as given to ``tiktoken.Encoding(pat_str=...)``.

    Returns:
        The equivalent ``re`` pattern (Han approximated, see module notes).

    Raises:
        ValueError: For a Unicode property the translation does not know.
    """
    out: list[str] = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if c == "[":
            mask, i = _class_mask(pat, i)
            out.append(_mask_to_re(mask))
        elif c == "\\":
            escaped, j = _escape_mask(pat, i)
            out.append(_mask_to_re(escaped) if escaped is not None else pat[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return re.compile("".join(out))


def split_pieces(text: str, pat: str = KIMI_PAT) -> list[str]:
    """Splits text into pre-token pieces with the translated pattern.

    Args:
        text: The text to split.
        pat: A tiktoken split pattern.

    Returns:
        The matched pieces, in order (unmatched characters are skipped, as tiktoken does).
    """
    return compile_pattern(pat).findall(text)


# ------------------------------------------------------------------ training


class _Pairs:
    """Adjacent-pair counts over the corpus's distinct pieces, with a lazy max-heap.

    ``words`` are the pieces as id lists and ``freqs`` their counts; ``where`` says which
    words hold a pair, so a merge rewrites only those. Heap entries go stale as counts
    change; ``pop_best`` skips them.
    """

    def __init__(self, words: list[list[int]], freqs: list[int]) -> None:
        self.words, self.freqs = words, freqs
        self.counts: dict[tuple[int, int], int] = defaultdict(int)
        self.where: dict[tuple[int, int], set[int]] = defaultdict(set)
        for wi, word in enumerate(words):
            for pair in zip(word, word[1:]):
                self.counts[pair] += freqs[wi]
                self.where[pair].add(wi)
        self.heap = [(-count, a, b) for (a, b), count in self.counts.items()]
        heapq.heapify(self.heap)

    def pop_best(self) -> tuple[int, int] | None:
        """The most frequent pair (ties: lower ids first), or None when none is left."""
        while self.heap:
            neg, a, b = heapq.heappop(self.heap)
            if neg != 0 and self.counts.get((a, b), 0) == -neg:
                return a, b
        return None

    def merge(self, a: int, b: int, new_id: int) -> None:
        """Replace every (a, b) by ``new_id`` in the words holding it; recount their pairs."""
        touched: set[tuple[int, int]] = set()
        for wi in sorted(self.where.pop((a, b), ())):
            word, freq = self.words[wi], self.freqs[wi]
            for pair in zip(word, word[1:]):
                self.counts[pair] -= freq
                touched.add(pair)
            out = _merged(word, a, b, new_id)
            self.words[wi] = out
            for pair in zip(out, out[1:]):
                self.counts[pair] += freq
                self.where[pair].add(wi)
                touched.add(pair)
        for pair in sorted(touched):
            count = self.counts[pair]
            if count > 0:
                heapq.heappush(self.heap, (-count, pair[0], pair[1]))
            else:
                del self.counts[pair]


def _merged(word: list[int], a: int, b: int, new_id: int) -> list[int]:
    """``word`` with each non-overlapping (a, b), left to right, replaced by ``new_id``."""
    out: list[int] = []
    k = 0
    while k < len(word):
        if k + 1 < len(word) and word[k] == a and word[k + 1] == b:
            out.append(new_id)
            k += 2
        else:
            out.append(word[k])
            k += 1
    return out


def train_ranks(texts: list[str], n_merges: int, pat: str = KIMI_PAT) -> dict[bytes, int]:
    """Trains byte-level BPE ranks, deterministically.

    Ranks 0..255 are the single bytes in byte order; each merge then adds the most
    frequent adjacent pair within pieces (ties: the pair of lower ids) as the next rank.
    A merge whose bytes already exist reuses that rank and adds nothing.

    Args:
        texts: The training corpus.
        n_merges: The number of ranks to add after the 256 bytes (fewer when the corpus
            has no pairs left).
        pat: The split pattern; pieces never merge across its matches.

    Returns:
        A dense ``{token bytes: rank}`` map, usable as tiktoken ``mergeable_ranks``.
    """
    counts: Counter[bytes] = Counter()
    for text in texts:
        counts.update(piece.encode("utf-8") for piece in split_pieces(text, pat))
    vocab = [bytes([b]) for b in range(256)]
    ranks = {token: rank for rank, token in enumerate(vocab)}
    pairs = _Pairs([list(piece) for piece in counts], list(counts.values()))
    added = 0
    while added < n_merges:
        best = pairs.pop_best()
        if best is None:
            break
        merged = vocab[best[0]] + vocab[best[1]]
        new_id = ranks.get(merged)
        if new_id is None:
            new_id = len(vocab)
            vocab.append(merged)
            ranks[merged] = new_id
            added += 1
        pairs.merge(*best, new_id)
    return ranks


# ------------------------------------------------------------------ files


def write_tiktoken_file(ranks: dict[bytes, int], path: str | Path) -> None:
    """Writes ranks as ``base64(bytes) SP rank`` lines, in rank order.

    Args:
        ranks: A dense ``{token bytes: rank}`` map.
        path: Destination file.
    """
    lines = [
        f"{base64.b64encode(token).decode('ascii')} {rank}\n"
        for token, rank in sorted(ranks.items(), key=lambda item: item[1])
    ]
    Path(path).write_text("".join(lines), encoding="ascii")


def read_tiktoken_file(path: str | Path) -> dict[bytes, int]:
    """Reads a rank file written by :func:`write_tiktoken_file` (or tiktoken's own)."""
    ranks = {}
    for line in Path(path).read_text(encoding="ascii").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def main(argv: list[str]) -> int:
    """``python -m waste.tools.bpe_train OUT.tiktoken N_MERGES CORPUS.txt...``"""
    if len(argv) < 3 or not argv[1].isdigit():
        print(main.__doc__, file=sys.stderr)
        return 64
    corpus = [Path(p).read_text(encoding="utf-8") for p in argv[2:]]
    write_tiktoken_file(train_ranks(corpus, int(argv[1])), argv[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
