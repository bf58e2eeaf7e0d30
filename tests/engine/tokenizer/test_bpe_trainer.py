"""waste.tools.bpe_train: deterministic, byte-first rank files that tiktoken reads back, and
a stdlib splitter that agrees with tiktoken's PAT on common text."""

from __future__ import annotations

import random

from tests.engine.tokenizer.harness import CASES, training_texts
from waste.tools.bpe_train import KIMI_PAT, read_tiktoken_file, train_ranks, write_tiktoken_file

# --------------------------------------------------------------------------- the trainer


def test_trainer_is_deterministic_and_byte_first(tiktoken, tmp_path, monkeypatch):
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


def test_trainer_split_agrees_with_tiktoken_on_common_text(tiktoken):
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
