"""The C tokenizer (native/src/tokenizer.c) against PyPI tiktoken, id for id.

Rank files are trained here with waste.tools.bpe_train; the C side is compiled into a
small shared library (ctypes) and the tok_driver CLI; the oracle is tiktoken.Encoding with
Kimi's PAT over the same rank file, with Kimi's pre-chunking applied in Python.
"""

from __future__ import annotations

import base64
import ctypes
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is the tokenizer oracle")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from waste.tools.bpe_train import (  # noqa: E402
    KIMI_PAT,
    read_tiktoken_file,
    train_ranks,
    write_tiktoken_file,
)

ROOT = Path(__file__).resolve().parents[2]
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
        return b"".join(self.token_bytes(i) for i in ids)

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


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the C tokenizer")
    return tmp_path_factory.mktemp("tokenizer_build")


@pytest.fixture(scope="session")
def lib(build_dir) -> ctypes.CDLL:
    so = build_dir / "libwt_test.so"
    subprocess.run(["gcc", *CFLAGS, "-shared", "-fPIC", *map(str, C_SOURCES), "-o", str(so)],
                   check=True)
    lib = ctypes.CDLL(str(so))
    lib.wt_tokenizer_load.restype = ctypes.c_int32
    lib.wt_tokenize.restype = ctypes.c_int32
    lib.wt_token_bytes.restype = ctypes.c_int32
    lib.wt_n_base_vocab.restype = ctypes.c_uint32
    lib.wt_n_vocab.restype = ctypes.c_uint32
    lib.wt_special_id.restype = ctypes.c_int32
    lib.wt_utf8_invalid_at.restype = ctypes.c_uint64
    lib.wt_utf8_invalid_at.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.wt_tokenizer_free.argtypes = [ctypes.c_void_p]
    return lib


@pytest.fixture(scope="session")
def models(build_dir, lib):
    """{kind: (CTokenizer, tiktoken.Encoding, ranks path)} for three trained rank files."""
    built = {}
    for seed, (kind, n_merges) in enumerate([("latin", 1500), ("cjk", 1500), ("mixed", 3000)]):
        ranks = train_ranks(training_texts(kind, random.Random(seed)), n_merges)
        ranks_path, specials_path = build_dir / f"{kind}.tiktoken", build_dir / f"{kind}.json"
        write_tiktoken_file(ranks, ranks_path)
        specials = {text: len(ranks) + 7 + i for i, text in enumerate(SPECIALS)}
        specials_path.write_text(json.dumps([{"id": i, "text": t} for t, i in specials.items()]))
        enc = tiktoken.Encoding(name=kind, pat_str=KIMI_PAT,
                                mergeable_ranks=read_tiktoken_file(ranks_path),
                                special_tokens=specials)
        built[kind] = (CTokenizer(lib, ranks_path, specials_path), enc, ranks_path)
    yield built
    for tok, _, _ in built.values():
        tok.close()


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


# --------------------------------------------------------------------------- oracle tests


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", KINDS)
def test_plain_matches_tiktoken(models, kind, case):
    tok, enc, _ = models[kind]
    text = CASES[case]
    assert tok.tokenize(text) == oracle(enc, text, markup=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_markup_matches_tiktoken(models, case):
    tok, enc, _ = models["mixed"]
    text = with_specials(CASES[case], random.Random(case))
    assert tok.tokenize(text, markup=True) == oracle(enc, text, markup=True)


def test_pre_chunking_matters_and_matches(models):
    """A 400k+ text and 25k+ runs: ids equal the chunked oracle, which differs from the
    unchunked encoding (so the test would catch a missing or misplaced cut)."""
    tok, enc, _ = models["latin"]
    rng = random.Random(3)
    body = "".join(rng.choice(["hello", "World", "camelCase", "it's", "123456"]) + rng.choice(" \n")
                   for _ in range(80_000))
    text = body[: MAX_ENCODE_CHARS - 2] + "helloWorld" + body
    assert len(text) > MAX_ENCODE_CHARS
    expected = oracle(enc, text, markup=False)
    assert expected != enc.encode_ordinary(text)
    assert tok.tokenize(text) == expected
    marked = text[:300_000] + "<|im_end|>" + text[300_000:]
    assert tok.tokenize(marked, markup=True) == oracle(enc, marked, markup=True)

    runs = "x" * (MAX_RUN_CHARS + 1) + "  " + " " * MAX_RUN_CHARS + "\n"
    assert oracle(enc, runs, False) != enc.encode_ordinary(runs)
    assert tok.tokenize(runs) == oracle(enc, runs, False)


def test_markup_special_cut_by_pre_chunking_is_text(models):
    """Kimi chunks first and finds specials per chunk: a special straddling a 25k cut is
    plain text in the reference, and so here."""
    tok, enc, _ = models["mixed"]
    text = "x" * (MAX_RUN_CHARS - 5) + "<|im_end|>" + "y<|im_end|>"
    ids = tok.tokenize(text, markup=True)
    assert ids == oracle(enc, text, markup=True)
    assert ids.count(tok.special_id("<|im_end|>")) == 1


def test_every_code_point_matches_tiktoken(models):
    """Every Unicode scalar value, shuffled, with separators: checks every table entry."""
    tok, enc, _ = models["mixed"]
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    random.Random(11).shuffle(cps)
    seps = ["", "", " ", "a", "'s", "\n", "1"]
    text = "".join(chr(c) + seps[c % len(seps)] for c in cps)
    assert tok.tokenize(text) == oracle(enc, text, markup=False)


TEXT_SETTINGS = settings(max_examples=300, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture])
ALPHABET = st.sampled_from(list("aAbZ'sStTrReEvVmMlLdD ſK\r\n\t 1234,.!\"<|>") +
                           ["\u0301", "\u0308", "ǅ", "中", "日", "カ", "、", "。", "ʰ", "ª",
                            "٣", "Ⅻ", "🙂", "\u00a0", "\u3000", "\u2028", "\x1c", "é", "ß"]
                           + SPECIALS[:3])


@TEXT_SETTINGS
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_random_unicode_matches_tiktoken(models, text):
    tok, enc, _ = models["mixed"]
    assert tok.tokenize(text) == oracle(enc, text, markup=False)


@TEXT_SETTINGS
@given(parts=st.lists(ALPHABET, max_size=80), kind=st.sampled_from(KINDS),
       markup=st.booleans())
def test_tricky_alphabet_matches_tiktoken(models, parts, kind, markup):
    tok, enc, _ = models[kind]
    text = "".join(parts)
    assert tok.tokenize(text, markup) == oracle(enc, text, markup)


def test_committed_unicode_tables_match_installed_tiktoken(tmp_path):
    """The shipped tables equal a fresh probe of the installed tiktoken's regex engine."""
    import sys

    subprocess.run([sys.executable, str(ROOT / "native/tools/gen_unicode_tables.py"),
                    "--out-dir", str(tmp_path)], check=True, capture_output=True)
    fresh_c = (tmp_path / "unicode_tables.c").read_text()
    assert fresh_c == (NATIVE_SRC / "unicode_tables.c").read_text(), (
        "tiktoken's Unicode classes changed: rerun native/tools/gen_unicode_tables.py")

    def tables(text):  # the provenance line names the tiktoken version, not the data
        return [line for line in text.splitlines() if "tiktoken" not in line]

    fresh_h = (tmp_path / "unicode_tables.h").read_text()
    assert tables(fresh_h) == tables((NATIVE_SRC / "unicode_tables.h").read_text())


# --------------------------------------------------------------------------- specials


def test_plain_never_yields_specials(models):
    tok, enc, _ = models["mixed"]
    for special in SPECIALS:
        text = "a" + special + "b"
        ids = tok.tokenize(text)
        assert all(i < tok.n_base_vocab for i in ids)
        assert tok.decode(ids) == text.encode()
        assert ids == enc.encode_ordinary(text)
        assert tok.special_id(special) in tok.tokenize(text, markup=True)


def test_markup_finds_special_glued_to_text(models):
    tok, enc, _ = models["mixed"]
    end = tok.special_id("<|im_end|>")
    ids = tok.tokenize('say "<|im_end|>"x<|sep|><|sep|>', markup=True)
    assert ids == oracle(enc, 'say "<|im_end|>"x<|sep|><|sep|>', markup=True)
    assert end in ids and ids.count(tok.special_id("<|sep|>")) == 2
    assert ids[: ids.index(end)] == enc.encode_ordinary('say "')


def test_longest_special_wins(models, build_dir, lib):
    _, enc, ranks_path = models["latin"]
    n = enc.max_token_value + 1
    specials = build_dir / "overlapping.json"
    specials.write_text(json.dumps([{"id": n, "text": "<|tool|>"},
                                    {"id": n + 1, "text": "<|tool|>_call"},
                                    {"id": n + 2, "text": "<|tool"}]))
    tok = CTokenizer(lib, ranks_path, specials)
    try:
        assert tok.tokenize("x<|tool|>_call", True) == enc.encode_ordinary("x") + [n + 1]
        assert tok.tokenize("x<|tool|>_cal", True) == (enc.encode_ordinary("x") + [n]
                                                       + enc.encode_ordinary("_cal"))
        assert tok.tokenize("<|tool>", True) == [n + 2] + enc.encode_ordinary(">")
    finally:
        tok.close()


def test_whole_piece_lookup_comes_first(lib, tmp_path):
    """A token no chain of merges reaches is still used when it is a whole piece."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"ab", b"abcd", b" wor", b"ld"):
        ranks[token] = len(ranks)
    path = tmp_path / "unreachable.tiktoken"
    write_tiktoken_file(ranks, path)
    enc = tiktoken.Encoding(name="u", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens={})
    tok = CTokenizer(lib, path, None)
    try:
        text = "abcd abcd abc world abcde"
        assert tok.tokenize(text) == enc.encode_ordinary(text)
        assert tok.tokenize("abcd") == [ranks[b"abcd"]]
        assert tok.tokenize("abcde") == [ranks[b"ab"], ord("c"), ord("d"), ord("e")]
    finally:
        tok.close()


def test_separate_segments_differ_from_concatenation(models):
    """Splitting a multi-character token between two calls changes the ids, as in tiktoken."""
    tok, enc, _ = models["latin"]
    word = max((t for t in enc.token_byte_values() if t.isalpha() and t.isascii()), key=len)
    word = word.decode()
    a, b = word[: len(word) // 2], word[len(word) // 2 :]
    joined, separate = tok.tokenize(a + b), tok.tokenize(a) + tok.tokenize(b)
    assert joined == enc.encode_ordinary(a + b) == [enc.encode_single_token(word)]
    assert separate == enc.encode_ordinary(a) + enc.encode_ordinary(b)
    assert joined != separate


# --------------------------------------------------------------------------- API contract


def test_space_reports_needed_size(models):
    tok, _, _ = models["latin"]
    data = "hello World camelCase 123456".encode()
    full = tok.tokenize(data)
    status, n, ids = tok.tokenize_status(data, False, 0)
    assert (status, n) == (E_SPACE, len(full))
    status, n, ids = tok.tokenize_status(data, False, 2)
    assert (status, n, ids) == (E_SPACE, len(full), full[:2])
    status, n, ids = tok.tokenize_status(data, False, len(full))
    assert (status, n, ids) == (OK, len(full), full)
    assert tok.tokenize_status(b"", False, 0)[:2] == (OK, 0)


def test_token_bytes_and_vocab(models):
    tok, enc, _ = models["mixed"]
    assert tok.n_base_vocab == enc.max_token_value - len(SPECIALS) - 6
    assert tok.n_vocab == enc.max_token_value + 1
    for i in (0, 65, 255, tok.n_base_vocab - 1):
        assert tok.token_bytes(i) == enc.decode_single_token_bytes(i)
    for special in SPECIALS:
        assert tok.token_bytes(tok.special_id(special)) == special.encode()
    assert tok.special_id("<|nope|>") == -1
    for bad in (-1, tok.n_base_vocab, tok.n_base_vocab + 6, tok.n_vocab, 2**31 - 1):
        assert tok.token_bytes(bad) == E_ARG


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), markup=st.booleans())
def test_invalid_utf8_is_refused_and_valid_round_trips(models, lib, data, markup):
    """engine.md §1: invalid UTF-8 is E_ARG (nothing produced); the offset is Python's."""
    tok, _, _ = models["mixed"]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        status, n, _ = tok.tokenize_status(data, markup, len(data) + 1)
        assert (status, n) == (E_ARG, 0)
        assert lib.wt_utf8_invalid_at(data, len(data)) == exc.start
        return
    assert lib.wt_utf8_invalid_at(data, len(data)) == 2**64 - 1
    ids = tok.tokenize(data, markup)
    assert tok.decode(ids) == data
    if not markup:
        assert all(0 <= i < tok.n_base_vocab for i in ids)


@pytest.mark.parametrize("data", [b"abc\xff\xfe\xe4\xb8def", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
                                  b"ok\xe4\xb8", b"\x80"])
def test_invalid_utf8_kinds_are_refused(models, data):
    """Stray bytes, a surrogate, an overlong form, > U+10FFFF, a truncated tail."""
    tok, _, _ = models["mixed"]
    for markup in (False, True):
        assert tok.tokenize_status(data, markup, 64)[:2] == (E_ARG, 0)


def rank_file_cases():
    good = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    return {
        "bad_base64": (good[:2] + ["!!!! 2"] + good[3:], E_FORMAT, ":3:"),
        "duplicate_rank": (good + ["YWI= 5"], E_FORMAT, ":257:"),
        "rank_not_dense": (good + ["YWI= 300"], E_FORMAT, ":257:"),
        "duplicate_bytes": (good + ["IQ== 256"], E_FORMAT, ":257:"),
        "missing_rank": (good[:10] + ["YWI= 10"] + good[11:], E_FORMAT, "0x0A"),
        "no_space": (good[:4] + ["YWI=256"] + good[4:], E_FORMAT, ":5:"),
        "rank_not_number": (good + ["YWI= 2x6"], E_FORMAT, ":257:"),
        "empty": ([], E_FORMAT, "no rank lines"),
    }


@pytest.mark.parametrize("case", sorted(rank_file_cases()))
def test_bad_rank_file_names_file_and_line(lib, tmp_path, case):
    lines, status, where = rank_file_cases()[case]
    path = tmp_path / "bad.tiktoken"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LoadError) as info:
        CTokenizer(lib, path, None)
    assert info.value.status == status
    assert str(path) in info.value.detail and where in info.value.detail


def test_good_minimal_rank_file_loads(lib, tmp_path):
    path = tmp_path / "bytes.tiktoken"
    write_tiktoken_file({bytes([b]): b for b in range(256)}, path)
    tok = CTokenizer(lib, path, None)
    try:
        assert (tok.n_base_vocab, tok.n_vocab) == (256, 256)
        assert tok.tokenize("hé") == list("hé".encode())
    finally:
        tok.close()


@pytest.mark.parametrize("body, where", [
    ('[{"id": 10, "text": "<|x|>"}]', "n_base_vocab"),
    ('[{"id": 300, "text": "<|x|>"},\n {"id": 300, "text": "<|y|>"}]', "duplicate special id"),
    ('[{"id": 300, "text": "<|x|>"},\n {"id": 301, "text": "<|x|>"}]', "same text"),
    ('[{"id": 300}]', ":1:"),
    ('[{"id": 300, "text": ""}]', "empty"),
    ('[\n{"id": 300, "text": "<|x|>"},\n{"id": "301", "text": "y"}]', ":3:"),
    ('[{"id": 300, "text": "\\ud800"}]', "surrogate"),
    ('{"id": 300}', "array"),
])
def test_bad_specials(lib, tmp_path, body, where):
    ranks = tmp_path / "bytes.tiktoken"
    write_tiktoken_file({bytes([b]): b for b in range(256)}, ranks)
    specials = tmp_path / "specials.json"
    specials.write_text(body)
    with pytest.raises(LoadError) as info:
        CTokenizer(lib, ranks, specials)
    assert info.value.status == E_FORMAT
    assert str(specials) in info.value.detail
    assert where in info.value.detail


def test_missing_files_are_io_errors(lib, tmp_path):
    ranks = tmp_path / "bytes.tiktoken"
    write_tiktoken_file({bytes([b]): b for b in range(256)}, ranks)
    for r, s in [(tmp_path / "nope.tiktoken", None), (ranks, tmp_path / "nope.json")]:
        with pytest.raises(LoadError) as info:
            CTokenizer(lib, r, s)
        assert info.value.status == E_IO and "nope" in info.value.detail


# --------------------------------------------------------------------------- CLI driver


def test_driver_under_sanitizers(build_dir, models):
    """tok_driver built with ASan/UBSan: round trips, invalid UTF-8 refused, ids, info."""
    exe = build_dir / "tok_driver_asan"
    subprocess.run(["gcc", *CFLAGS, "-g", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", str(ROOT / "native/tests/tok_driver.c"),
                    *map(str, C_SOURCES), "-o", str(exe)], check=True)
    tok, enc, ranks_path = models["mixed"]
    specials = ranks_path.with_suffix(".json")
    rng = random.Random(5)
    inputs = [CASES["mixed_words"].encode(), CASES["long_spaces"].encode(),
              bytes(rng.randrange(256) for _ in range(5000)).decode("utf-8", "replace").encode(),
              with_specials(CASES["han_kana"], rng).encode() + b"\xf0\x9f\x99\x82"]
    for data in inputs:
        for markup in ([], ["--markup"]):
            run = subprocess.run([str(exe), str(ranks_path), "--specials", str(specials),
                                  *markup, "--roundtrip"], input=data, capture_output=True)
            assert run.returncode == 0, run.stderr.decode()
            assert run.stdout.decode() == f"ok {len(tok.tokenize(data, bool(markup)))}\n"
    run = subprocess.run([str(exe), str(ranks_path), "--roundtrip"], input=b"ab\xf0\x9f\x99", capture_output=True)
    assert run.returncode == 1 and b"status -5: invalid UTF-8 at byte 2" in run.stderr, run.stderr.decode()
    run = subprocess.run([str(exe), str(ranks_path)], input=CASES["ascii"].encode(),
                         capture_output=True, check=True)
    assert [int(x) for x in run.stdout.split()] == enc.encode_ordinary(CASES["ascii"])
    info = subprocess.run([str(exe), str(ranks_path), "--info"], capture_output=True, check=True)
    assert info.stdout.decode().startswith(f"n_base_vocab {tok.n_base_vocab} ")
    # Failed loads free everything (LeakSanitizer would change the exit status).
    bad_ranks = build_dir / "bad_driver.tiktoken"
    bad_ranks.write_text(ranks_path.read_text() + "!!!! 99999\n")
    bad_specials = build_dir / "bad_driver.json"
    bad_specials.write_text('[{"id": %d, "text": "<|a|>"}, {"id": 1, "text": "x"}]' % tok.n_vocab)
    for args in ([str(bad_ranks)], [str(ranks_path), "--specials", str(bad_specials)]):
        run = subprocess.run([str(exe), *args, "--info"], capture_output=True)
        assert run.returncode == 1 and b"status -2" in run.stderr, run.stderr.decode()


# --------------------------------------------------------------------------- the trainer


def test_trainer_is_deterministic_and_byte_first(tmp_path, monkeypatch):
    texts = training_texts("latin", random.Random(1))
    ranks = train_ranks(texts, 300)
    assert ranks == train_ranks(texts, 300)
    assert len(ranks) == 256 + 300
    assert sorted(ranks.values()) == list(range(len(ranks)))
    assert all(ranks[bytes([b])] == b for b in range(256))
    path = tmp_path / "r.tiktoken"
    write_tiktoken_file(ranks, path)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # read the file itself, no cache
    from tiktoken.load import load_tiktoken_bpe

    assert load_tiktoken_bpe(str(path)) == ranks
    assert read_tiktoken_file(path) == ranks


def test_trainer_split_agrees_with_tiktoken_on_common_text():
    """The stdlib splitter approximates PAT (Han by character name); outside Han
    punctuation it splits like tiktoken. With every piece a token, tiktoken's ids
    decode to exactly the splitter's pieces when the splits agree."""
    from waste.tools.bpe_train import split_pieces

    text = "".join(CASES[k] for k in ("ascii", "camel_contractions", "latin_accents", "digits",
                                      "whitespace", "crlf_punct", "marks", "emoji"))
    text += "中文字符和日本語の文章カタカナとひらがな"
    pieces = [p.encode() for p in split_pieces(text)]
    ranks = {bytes([b]): b for b in range(256)}
    for piece in pieces:
        ranks.setdefault(piece, len(ranks))
    enc = tiktoken.Encoding(name="pieces", pat_str=KIMI_PAT, mergeable_ranks=ranks,
                            special_tokens={})
    assert [enc.decode_single_token_bytes(i) for i in enc.encode_ordinary(text)] == pieces
