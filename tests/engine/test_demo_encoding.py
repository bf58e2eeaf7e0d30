"""The demo trainer's second-phase encoding (waste.tools.demo_train): a word task's answer
written one letter a token is the same text as its canonical encoding and parses back, and
the made-up words of that phase are cut by the real vocabulary into the pieces drawn."""

from __future__ import annotations

import random


def test_spelled_answers_are_the_same_text_one_letter_a_token(torch_stack):
    from waste.tools import demo_data, demo_train

    tok = demo_train.Tok(demo_train.build_vocabulary(0))
    vocab = demo_train.letter_pieces(tok)
    rng = random.Random(2)
    for family in ("reverse", "upper", "add"):
        ex = demo_data.make_example(family, rng, held_out=False, pieces=vocab)
        spelled, n = demo_train.encode(tok, ex, spelled_answers=True)  # asserts the parse back
        canonical, n2 = demo_train.encode(tok, ex)
        assert n == n2 and spelled[:n] == canonical[:n]
        text = b"".join(tok.piece(i) for i in spelled[n:])
        assert text == b"".join(tok.piece(i) for i in canonical[n:])
        if family == "add":
            assert spelled == canonical
            continue
        answer = ex.reply.content.rsplit(" ", 1)[1].rstrip(".").encode()
        letters = [tok.piece(i) for i in spelled[n:]]
        # the answer after "is " in the reasoning and in the content, one byte a token
        runs = [k for k in range(len(letters)) if letters[k:k + len(answer) + 1] ==
                [b" "] + [bytes([c]) for c in answer]]
        assert len(runs) == 2, letters
        assert len(spelled) > len(canonical)


def test_second_phase_words_keep_their_pieces_under_the_real_vocabulary(torch_stack):
    from waste.tools import demo_data, demo_train

    tok = demo_train.Tok(demo_train.build_vocabulary(0))
    vocab = demo_train.letter_pieces(tok)
    assert len(vocab.pieces) > 300 and all(p.strip(" ").isalpha() for p in vocab.pieces)
    rng = random.Random(3)
    counts: dict[str, int] = {}
    for _ in range(3000):
        w = demo_data.piece_word(rng, vocab)
        assert 3 <= len(w) <= 8 and w not in demo_data.WORDS
        for p in vocab.cut(" " + w):
            counts[p] = counts.get(p, 0) + 1
    # drawn evenly: most pieces are met, none dominates but the lone space
    met = sum(1 for p in vocab.pieces if counts.get(p))
    assert met > 0.85 * len(vocab.pieces)
    assert max(c for p, c in counts.items() if p != " ") < 200
