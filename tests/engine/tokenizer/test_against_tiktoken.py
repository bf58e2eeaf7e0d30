"""The C tokenizer (native/src/tokenizer.c) against PyPI tiktoken, id for id: the corpus,
Kimi's pre-chunking, every code point, random text, and how specials are found."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.tokenizer.harness import (CASES, KINDS, MAX_ENCODE_CHARS, MAX_RUN_CHARS, NATIVE_SRC,
                                            ROOT, SPECIALS, CTokenizer, oracle, with_specials)
from waste.tools.bpe_train import KIMI_PAT, write_tiktoken_file

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
@given(text=st.text(st.characters(blacklist_categories=["Cs"]), max_size=200))
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


def test_committed_unicode_tables_match_installed_tiktoken(tiktoken, tmp_path):
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


def test_whole_piece_lookup_comes_first(lib, tiktoken, tmp_path):
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
