"""The demo model's conversations: deterministic, split by question, and every reply in the
exact grammar the server's reply parser reads back."""

from __future__ import annotations

import json

from waste.domain.xtml.reply import RegionParser
from waste.tools import demo_data
from waste.tools.demo_domain import prompt_segments, reply_segments


def _questions(examples) -> set[str]:
    return {ex.body["messages"][-1]["content"] if ex.family != "time_result"
            else ex.body["messages"][-3]["content"] for ex in examples}


def test_training_draws_are_a_pure_function_of_seed_and_step():
    a = demo_data.training_examples(0, 7, 30)
    assert a == demo_data.training_examples(0, 7, 30)
    assert a != demo_data.training_examples(0, 8, 30)
    assert a != demo_data.training_examples(1, 7, 30)


def test_held_out_questions_are_never_trained_on():
    held = demo_data.held_out_examples(0, 12)
    assert {ex.family for ex in held} == set(demo_data.FAMILIES)
    trained = [ex for step in range(100) for ex in demo_data.training_examples(0, step, 40)]
    # A question is its text (number pair, word, phrasing, city); time questions are split
    # by (city, phrasing), so the same text never appears on both sides.
    assert not _questions(held) & _questions(trained)


def test_every_reply_parses_back_to_the_intended_message():
    for ex in demo_data.held_out_examples(3, 4) + demo_data.training_examples(3, 0, 60):
        prompt, thinking = prompt_segments(ex.body)
        assert prompt[-2].text == ("think" if thinking else "response")
        parser = RegionParser(thinking=thinking)
        parser.feed("".join(s.text for s in reply_segments(ex.reply.message(), thinking=thinking)))
        parser.finish()
        assert parser.done
        assert demo_data.grade(ex, parser.message()) == (True, True), ex


def test_the_grader_tells_wrong_and_malformed_apart():
    add = demo_data.make_example("add", __import__("random").Random(1), held_out=False)
    good = {"reasoning_content": add.reply.reasoning, "content": add.reply.content}
    assert demo_data.grade(add, good) == (True, True)
    assert demo_data.grade(add, {**good, "content": "1 + 1 = 3."}) == (True, False)
    assert demo_data.grade(add, {"content": add.reply.content}) == (False, False)
    call = demo_data.make_example("time_call", __import__("random").Random(1), held_out=False)
    name, args = call.reply.calls[0]
    tool_call = {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    assert demo_data.grade(call, {"reasoning_content": "x", "tool_calls": [tool_call]}) == (True, True)
    bad_args = {**tool_call, "function": {"name": name, "arguments": '{"tz": "Mars/Base"}'}}
    assert demo_data.grade(call, {"reasoning_content": "x", "tool_calls": [bad_args]}) == (True, False)
    assert demo_data.grade(call, {"reasoning_content": "x", "content": "It is noon."}) == (False, False)


def test_made_up_words_are_never_real_words_and_never_held_out():
    rng = __import__("random").Random(5)
    made_up = {demo_data.pseudo_word(rng) for _ in range(2000)}
    assert len(made_up) > 1000 and not made_up & set(demo_data.WORDS)
    assert all(3 <= len(w) <= 8 and w.isalpha() and w.islower() for w in made_up)
    held = demo_data.held_out_examples(0, 12)
    held_words = {ex.body["messages"][-1]["content"] for ex in held if ex.family in ("reverse", "upper")}
    assert all(any(w in q for w in demo_data.WORDS) for q in held_words)


def test_every_held_out_who_question_has_its_core_question_trained():
    held = {ex.body["messages"][-1]["content"] for ex in demo_data.held_out_examples(0, 12)
            if ex.family == "who"}
    trained = {ex.body["messages"][-1]["content"] for step in range(60)
               for ex in demo_data.training_examples(0, step, 40) if ex.family == "who"}
    assert held and not held & trained
    for q in held:
        core = next(c for c in demo_data.WHO_CORE if q.endswith(c))
        assert any(t.endswith(core) for t in trained), q


def test_multiplication_counts_the_larger_factor_up_to_the_smaller():
    assert demo_data._mul(6, 4).reasoning == (
        "Multiplication. 6 × 4, counted as 6 × 4: 6 × 1 = 6, 6 × 2 = 12, 6 × 3 = 18, "
        "6 × 4 = 24. So 6 × 4 = 24.")
    assert demo_data._mul(4, 6).reasoning == (
        "Multiplication. 4 × 6, counted as 6 × 4: 6 × 1 = 6, 6 × 2 = 12, 6 × 3 = 18, "
        "6 × 4 = 24. So 4 × 6 = 24.")
    assert demo_data._mul(0, 7).reasoning == ("Multiplication. 0 × 7, counted as 7 × 0: "
                                              "anything times 0 is 0. So 0 × 7 = 0.")


def test_a_mirrored_question_writes_the_same_chain():
    """The count after the header is the same text for both orders: what a held-out order
    needs is exactly what its trained mirror wrote."""
    def chain(a: int, b: int) -> str:
        return demo_data._mul(a, b).reasoning.split(", counted as ", 1)[1].split(". So ")[0]

    for a in range(10):
        for b in range(10):
            assert chain(a, b) == chain(b, a)


def test_a_held_out_product_s_mirror_is_trained():
    held = {(a, b) for a in range(10) for b in range(10) if demo_data._is_held_out("mul", ("mul", a, b), "")}
    assert held and all(a != b and (b, a) not in held for a, b in held)
    questions = _questions(ex for ex in demo_data.held_out_examples(0, 12) if ex.family == "mul")
    assert questions and not questions & _questions(
        ex for step in range(100) for ex in demo_data.training_examples(0, step, 40) if ex.family == "mul")


def test_every_held_out_greeting_has_its_core_greeting_trained():
    held = {ex.body["messages"][-1]["content"] for ex in demo_data.held_out_examples(0, 12)
            if ex.family == "greet"}
    trained = {ex.body["messages"][-1]["content"] for step in range(100)
               for ex in demo_data.training_examples(0, step, 40) if ex.family == "greet"}
    assert held and not held & trained
    def core(greeting: str) -> str:
        return max((c for c in demo_data.GREET_CORE if greeting.startswith(c)), key=len)

    for q in held:
        assert any(core(t) == core(q) for t in trained), q


def test_the_vocabulary_corpus_has_no_word_to_reverse_or_upper_case():
    texts = list(demo_data.corpus_texts(0, 300))
    assert any("Addition." in t for t in texts) and any("get_time" in t for t in texts)
    assert not any(t.startswith(("Reverse.", "Uppercase.")) or "reversed is" in t or "in capitals is" in t
                   for t in texts)


def test_piece_words_are_cut_into_the_pieces_they_were_made_of():
    """demo_data.piece_word on a toy vocabulary whose cut is one letter a piece after a lone
    space: every word is three letters (two or three pieces, at least three letters), cut as
    drawn, never a real word, and a pure function of the generator's state."""
    letters = tuple("abcdefghijklmnopqrstuvwxyz")
    vocab = demo_data.LetterPieces(letters, lambda text: [" ", *text[1:]])
    words = [demo_data.piece_word(__import__("random").Random(9), vocab) for _ in range(2)]
    assert words[0] == words[1]
    rng = __import__("random").Random(4)
    made = {demo_data.piece_word(rng, vocab) for _ in range(500)}
    assert len(made) > 400 and not made & set(demo_data.WORDS)
    assert all(len(w) == 3 and w.isalpha() for w in made)
    # The second phase's draws use them for every made-up word.
    drawn = demo_data.training_examples(0, 3, 200, vocab)
    words = {ex.reply.content.split(" ")[0] for ex in drawn if ex.family in demo_data.WORD_TASKS}
    assert any(len(w) == 3 and w not in demo_data.WORDS for w in words)
    assert all(len(w) == 3 or w in demo_data.WORDS for w in words)
