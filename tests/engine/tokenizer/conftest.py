"""Fixtures of the C tokenizer tests: the compiled tokenizer, tiktoken, trained rank files."""

from __future__ import annotations

import ctypes
import json
import random
import subprocess
from pathlib import Path

import pytest

from tests.engine.conftest import require_compiler, require_module
from tests.engine.tokenizer.harness import (C_SOURCES, CFLAGS, SPECIALS, CTokenizer,
                                            training_texts)
from waste.tools.bpe_train import KIMI_PAT, read_tiktoken_file, train_ranks, write_tiktoken_file


@pytest.fixture(scope="session")
def tiktoken():
    """The PyPI tokenizer the C one must match id for id."""
    return require_module("tiktoken", "it is the tokenizer oracle (tiktoken==0.14.0)")


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    require_compiler()
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
def models(build_dir, lib, tiktoken):
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
