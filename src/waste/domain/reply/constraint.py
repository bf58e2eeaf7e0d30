"""A grammar on the answer only: the allowed-token mask a constrained reply is generated with.

The reasoning stays free; the grammar applies from the first token of the answer (the reply
reader's ``in_answer``: XTML's ``response`` region, chat.json content after the think close)
until it is complete, then only the answer's close ids are allowed, and after the close only
the plan's end ids. The grammar itself is behind the ``TokenMatcher`` port (llguidance in
``waste.adapters.grammar``); this module is pure and decides only where it applies.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from waste.domain.reply.events import ReplyReader


class TokenMatcher(Protocol):
    """One reply's grammar state over token ids (the adapter owns the vocabulary)."""

    def fill(self, words: memoryview) -> None:
        """Clear the bits of the ids the grammar forbids next; the grammar's end is signalled
        by the bits of the close ids the matcher was built with."""
        ...

    def consume(self, token: int) -> None:
        """Advance over a sampled token (a close id ends the grammar)."""
        ...

    def finished(self) -> bool:
        """True once no further grammar token is possible (only a close id may follow)."""
        ...


def allow_only(words: memoryview, ids: tuple[int, ...]) -> None:
    """Clear every bit, then set those of ``ids``."""
    words[:] = memoryview(bytes(4 * len(words))).cast("I")
    for token in ids:
        words[token // 32] |= 1 << (token % 32)


@attrs.define
class AnswerConstraint:
    """The mask filler for one constrained reply (``MaskFiller``: ``self(index, words)``).

    ``end_sequence`` is what closes the answer and the message (XTML: the ids of
    ``<|close|>response<|sep|><|end_of_msg|>``; chat.json: an end marker). Its first id stands
    for the grammar's end; once it is sampled the rest is forced, one id per token.
    ``observe`` must see every sampled token after the reader has (the generation service
    calls it from its token callback); the next mask is then decided from the reader's region.
    """

    reader: ReplyReader
    matcher: TokenMatcher
    end_sequence: tuple[int, ...]
    _constrained: bool = attrs.field(default=False, init=False)
    _forced: int = attrs.field(default=-1, init=False)  # index into end_sequence once closing

    def __call__(self, index: int, words: memoryview) -> bool:
        self._constrained = False
        if self._forced >= 0:
            allow_only(words, self.end_sequence[min(self._forced, len(self.end_sequence) - 1):][:1])
        elif self.reader.in_answer:
            self._constrained = True
            if self.matcher.finished():
                allow_only(words, self.end_sequence[:1])
            else:
                self.matcher.fill(words)
        return False

    def observe(self, token: int) -> None:
        """The token sampled under the last mask."""
        if self._forced >= 0:
            self._forced += 1
        elif self._constrained:
            if token == self.end_sequence[0]:
                self._forced = 1
            else:
                self.matcher.consume(token)


@attrs.define
class ReplyConstraint:
    """The mask filler for a reply under one grammar from its first token to its end marker
    (tools declared: ``ChatPlan.reply_grammar``). Free stretches (reasoning, text) are the
    grammar's own text lexemes, so no region tracking is needed; ``observe`` must see every
    sampled token."""

    matcher: TokenMatcher

    def __call__(self, index: int, words: memoryview) -> bool:
        self.matcher.fill(words)
        return False

    def observe(self, token: int) -> None:
        """The token sampled under the last mask."""
        self.matcher.consume(token)
