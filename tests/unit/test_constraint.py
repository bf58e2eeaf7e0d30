"""AnswerConstraint (domain/reply/constraint.py) token by token, with a scripted matcher: free
outside the answer, the grammar inside it, then the close sequence forced id by id."""

from __future__ import annotations

import array

import attrs

from waste.domain.reply.constraint import AnswerConstraint, allow_only

VOCAB = 96


@attrs.define
class Reader:
    in_answer: bool = False


@attrs.define
class Matcher:
    """Allows only ``allowed``; finished after ``length`` tokens."""

    allowed: tuple[int, ...]
    length: int
    consumed: list[int] = attrs.Factory(list)

    def fill(self, words):
        keep = array.array("I", [0]) * len(words)
        for token in self.allowed:
            keep[token // 32] |= 1 << (token % 32)
        for w in range(len(words)):
            words[w] &= keep[w]

    def consume(self, token):
        self.consumed.append(token)

    def finished(self):
        return len(self.consumed) >= self.length


def _mask(constraint, index=0) -> set[int]:
    words = array.array("I", [0xFFFFFFFF]) * (VOCAB // 32)
    assert constraint(index, memoryview(words)) is False
    return {t for t in range(VOCAB) if (words[t // 32] >> (t % 32)) & 1}


def test_free_outside_the_answer_grammar_inside_then_the_forced_close():
    reader, matcher = Reader(), Matcher(allowed=(5, 6), length=2)
    constraint = AnswerConstraint(reader=reader, matcher=matcher, end_sequence=(90, 91, 92))
    assert _mask(constraint) == set(range(VOCAB))  # reasoning: free
    constraint.observe(40)
    assert matcher.consumed == []
    reader.in_answer = True
    assert _mask(constraint) == {5, 6}
    constraint.observe(5)
    assert _mask(constraint) == {5, 6}
    constraint.observe(6)
    assert matcher.finished()
    assert _mask(constraint) == {90}  # the grammar is complete: only the close
    constraint.observe(90)
    reader.in_answer = False
    assert _mask(constraint) == {91}
    constraint.observe(91)
    assert _mask(constraint) == {92}
    constraint.observe(92)
    assert _mask(constraint) == {92}  # past the sequence: its last id (the end) again
    assert matcher.consumed == [5, 6]


def test_the_close_may_come_before_the_matcher_says_finished():
    reader, matcher = Reader(in_answer=True), Matcher(allowed=(5, 90), length=10)
    constraint = AnswerConstraint(reader=reader, matcher=matcher, end_sequence=(90, 91))
    assert _mask(constraint) == {5, 90}
    constraint.observe(90)  # the matcher allowed its end: the close starts
    assert _mask(constraint) == {91}
    assert matcher.consumed == []


def test_allow_only():
    words = array.array("I", [0xFFFFFFFF]) * 3
    allow_only(memoryview(words), (0, 33, 95))
    assert list(words) == [1, 2, 1 << 31]
