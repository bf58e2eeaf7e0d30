"""Shared pieces of the C tokenizer tests: the ctypes view of native/src/tokenizer.h, Kimi's
reference pre-chunking, the tiktoken oracle call, training texts and the test corpus.

The C side is compiled into a small shared library (conftest.py) and the tok_driver CLI;
the oracle is tiktoken.Encoding with Kimi's PAT over the same rank file.
"""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

from tests.engine.conftest import REPO

ROOT = REPO
NATIVE_SRC = ROOT / "native" / "src"
C_SOURCES = [NATIVE_SRC / "tokenizer.c", NATIVE_SRC / "unicode_tables.c"]
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{NATIVE_SRC}"]

OK, E_IO, E_FORMAT, E_ARG, E_SPACE = 0, -1, -2, -5, -10
MAX_ENCODE_CHARS, MAX_RUN_CHARS = 400_000, 25_000

# Kimi-like specials; none is a prefix of another (tiktoken's alternation order is a
# HashMap's, so prefix-related specials would make the oracle nondeterministic).
SPECIALS = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
            "<|im_system|>", "<|im_middle|>", "<|media_start|>", "<|media_end|>", "<|sep|>"]

WORDS = ["hello", "World", "camelCase", "getHTTPResponse", "parseJSONValue", "XMLHttpRequest",
         "don't", "I'LL", "we've", "it's", "THEY'RE", "she'd", "I'm", "ſ'S", "o'Neil",
         "Ünïcödé", "naïve", "café", "Straße", "ǅemal", "Ωmega", "ÀÉÎ", "résumé",
         "中文", "漢字テキスト", "ひらがな", "カタカナ", "日本語の文章", "한국어", "、。「引用」",
         "123456", "3.14159", "0x1F", "1,000,000", "٣٤٥", "Ⅻ", "½",
         "🙂", "👍🏽", "👨‍👩‍👧", "🇯🇵", "e\u0301", "a\u0308\u0301", "\u0301\u0302",
         "\r\n", "\n\n", "\r", "  ", "\t", "   \n", "x = y + 1;", "#include <stdio.h>",
         "--", "...", "!!!", "\u00a0", "\u3000", "\u2028", "\x1c", "\u200b", "\ufeff"]


# --------------------------------------------------------------------------- helpers


def kimi_chunks(text: str):
    """Kimi's reference pre-chunking (tokenization_kimi.py), verbatim in behaviour."""
    for i in range(0, len(text), MAX_ENCODE_CHARS):
        s = text[i : i + MAX_ENCODE_CHARS]
        run, is_space, start = 0, s[0].isspace() if s else False, 0
        for k, ch in enumerate(s):
            now = ch.isspace()
            if is_space ^ now:
                run, is_space = 1, now
            else:
                run += 1
                if run > MAX_RUN_CHARS:
                    yield s[start:k]
                    start, run = k, 1
        yield s[start:]


def oracle(enc, text: str, markup: bool) -> list[int]:
    ids: list[int] = []
    for chunk in kimi_chunks(text):
        ids += enc.encode(chunk, allowed_special="all") if markup else enc.encode_ordinary(chunk)
    return ids


class CTokenizer:
    """ctypes view of the wt_* API in native/src/tokenizer.h."""

    def __init__(self, lib: ctypes.CDLL, ranks: Path, specials: Path | None):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        status = lib.wt_tokenizer_load(
            str(ranks).encode(), str(specials).encode() if specials else None,
            ctypes.byref(self.handle), err, ctypes.c_uint64(512))
        if status != OK:
            raise LoadError(status, err.value.decode())

    def close(self) -> None:
        self.lib.wt_tokenizer_free(self.handle)
        self.handle = ctypes.c_void_p()

    def tokenize_status(self, data: bytes, markup: bool, cap: int):
        out = (ctypes.c_int32 * max(cap, 1))()
        n = ctypes.c_uint64(12345)
        status = self.lib.wt_tokenize(self.handle, data, ctypes.c_uint64(len(data)),
                                      int(markup), out if cap else None,
                                      ctypes.c_uint64(cap), ctypes.byref(n))
        return status, n.value, list(out[: min(cap, n.value)])

    def tokenize(self, text: str | bytes, markup: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        status, n, ids = self.tokenize_status(data, markup, len(data) + 1)
        assert status == OK, status
        assert n == len(ids)
        return ids

    def token_bytes(self, token: int) -> bytes | int:
        ptr, n = ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_uint64()
        status = self.lib.wt_token_bytes(self.handle, ctypes.c_int32(token), ctypes.byref(ptr),
                                         ctypes.byref(n))
        return ctypes.string_at(ptr, n.value) if status == OK else status

    def decode(self, ids: list[int]) -> bytes:
        pieces = []
        for i in ids:
            piece = self.token_bytes(i)
            assert isinstance(piece, bytes), f"wt_token_bytes({i}) failed: {piece}"
            pieces.append(piece)
        return b"".join(pieces)

    @property
    def n_base_vocab(self) -> int:
        return self.lib.wt_n_base_vocab(self.handle)

    @property
    def n_vocab(self) -> int:
        return self.lib.wt_n_vocab(self.handle)

    def special_id(self, text: str) -> int:
        return self.lib.wt_special_id(self.handle, text.encode())


class LoadError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(f"status {status}: {detail}")
        self.status, self.detail = status, detail


def training_texts(kind: str, rng: random.Random) -> list[str]:
    def words(pool, n, seps=(" ", " ", "", "\n", ", ")):
        return "".join(rng.choice(pool) + rng.choice(seps) for _ in range(n))

    latin = [w for w in WORDS if all(ord(c) < 0x2000 for c in w)]
    if kind == "latin":
        return [words(latin, 6000), "\r\n".join(str(rng.randrange(10**9)) for _ in range(800))]
    if kind == "cjk":
        return [words(WORDS, 6000, seps=("", "", " ", "。", "\n"))]
    # mixed: everything, whitespace runs over 25k, and random code points.
    randoms = "".join(chr(rng.randrange(0x20, 0x30000)) for _ in range(6000))
    randoms = "".join(c for c in randoms if not 0xD800 <= ord(c) < 0xE000)
    return [words(WORDS, 5000), " " * 30_000 + "x", "\t\n" * 200, randoms]


KINDS = ["latin", "cjk", "mixed"]


def corpus_cases() -> dict[str, str]:
    rng = random.Random(7)
    cases = {
        "ascii": "The quick brown fox jumps over the lazy dog. It's 12:30, isn't it?\n",
        "camel_contractions": "getHTTPResponse parseJSONValue I'LL WE'VE she'D ſ'S o'Neil'S "
                              "don't'll 'S x'st HTMLParser iOS macOS",
        "latin_accents": "Ünïcödé naïve café résumé Straße ǅemal ÀÉÎÕÜ ÿ Ωmega ĳ ﬁ",
        "han_kana": "中文字符和日本語の文章、カタカナとひらがな。漢字テキストabc中文123。",
        "emoji": "🙂 👍🏽 👨‍👩‍👧 🇯🇵🇺🇸 ❤️ 🙂🙂🙂 a🙂b",
        "digits": "1 12 123 1234 12345 123456789012 ٣٤٥٦ Ⅻ½ 3.14159 1,000,000",
        "marks": "e\u0301 a\u0308\u0301 \u0301\u0302x \u0301 ो नमस्ते क्षि ά",
        "whitespace": "a  b   c\t\td \n\n e\r\n\r\nf \u00a0g\u3000h\u2028i\x1c\x1dj   \n  ",
        "crlf_punct": "x\r\n\r\n!!!\r\n...\n\n--\r #include <stdio.h>\n\ty = (a+b);\r\n",
        "random_cps": "".join(chr(c) for c in (rng.randrange(0x20, 0x30000) for _ in range(3000))
                              if not 0xD800 <= c < 0xE000),
        "mixed_words": "".join(rng.choice(WORDS) + rng.choice(["", " ", "\n", "'"])
                               for _ in range(3000)),
        "long_letters": "x" * (MAX_RUN_CHARS + 7) + " tail",
        "long_spaces": "a" + " " * (MAX_RUN_CHARS * 2 + 3) + "b",
        "long_mixed_line": "".join(rng.choice(["ab", "Cd", "中", "1", "é", "!", "🙂"])
                                   for _ in range(30_000)),
        "long_digits": "7" * 60_000 + "x1234",
        "long_newlines": "\n" * 30_000 + "x" + "\r\n" * 13_000,
        # U+001C is str.isspace (the pre-chunker's whitespace) but not Rust's \s.
        "isspace_not_white_space": "hello" * 4_000 + "\x1c" + "hello" * 4_000
                                   + "\x1d\x1e" * 13_000,
    }
    return cases


CASES = corpus_cases()


def with_specials(text: str, rng: random.Random) -> str:
    parts = text.split(" ")
    return "".join(p + rng.choice([" ", " ", "", '"'] + SPECIALS) for p in parts)

