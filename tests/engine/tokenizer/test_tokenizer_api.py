"""The C tokenizer's API contract: E_SPACE sizes, token bytes, invalid UTF-8 refused with
its byte offset, rank-file and specials errors naming file and line, and the CLI driver under ASan."""

from __future__ import annotations

import base64
import random
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.tokenizer.harness import (C_SOURCES, CASES, CFLAGS, E_ARG, E_FORMAT, E_IO, E_SPACE, OK,
                                            ROOT, SPECIALS, CTokenizer, LoadError, with_specials)
from waste.tools.bpe_train import write_tiktoken_file

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
    """docs/ENGINE.md §1: invalid UTF-8 is E_ARG (nothing produced); the offset is Python's."""
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
