"""Stop strings over streamed content, held back in whole tokens.

A content tail that could still grow into a stop string is held, together with every token
overlapping it, so a stop string split across tokens never leaks (docs/HTTP.md §4.3). Each released
entry keeps its token's logprob, so logprob entries concatenate to the content.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class ContentPiece:
    """Content text attributed to one generated token (``logprob`` None when no token made it)."""

    text: str
    logprob: float | None


@attrs.define
class StopStringFilter:
    """Feeds content pieces in, releases those that can no longer be part of a stop string."""

    stops: tuple[str, ...]
    _held: list[ContentPiece] = attrs.field(factory=list)
    matched: str | None = None

    def push(self, piece: ContentPiece) -> list[ContentPiece]:
        """Add one token's content; return what is now safe to emit (cut at a match)."""
        if self.matched is not None:
            return []
        if not self.stops:
            return [piece]
        self._held.append(piece)
        text = "".join(p.text for p in self._held)
        cut = _earliest_match(text, self.stops)
        if cut is not None:
            self.matched = cut[1]
            released = _take_chars(self._held, cut[0])
            self._held = []
            return released
        keep = _longest_prefix_tail(text, self.stops)
        return self._release_before(len(text) - keep)

    def flush(self) -> list[ContentPiece]:
        """End of output: whatever is held can no longer match, so release it."""
        held, self._held = self._held, []
        return [] if self.matched is not None else held

    def _release_before(self, boundary: int) -> list[ContentPiece]:
        # Release whole pieces lying entirely before ``boundary``; keep every piece that
        # overlaps the held tail (held back in whole tokens).
        released, pos = [], 0
        while self._held and pos + len(self._held[0].text) <= boundary:
            piece = self._held.pop(0)
            pos += len(piece.text)
            released.append(piece)
        return released


def _earliest_match(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(start, stop) of the match that completes first; at the same end, the longer one.

    Ordering by end rather than start makes the cut independent of how the text was split
    into tokens: it is where a character-by-character stream would first see a whole stop
    string (" E" then " " with stops "E" and " E " stops at "E", as " E " in one token does).
    """
    best: tuple[int, int, str] | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or (at + len(stop), at) < best[:2]):
            best = (at + len(stop), at, stop)
    return None if best is None else (best[1], best[2])


def _longest_prefix_tail(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def _take_chars(pieces: list[ContentPiece], n: int) -> list[ContentPiece]:
    out, left = [], n
    for piece in pieces:
        if left <= 0:
            break
        text = piece.text[:left]
        left -= len(text)
        if text:
            out.append(ContentPiece(text, piece.logprob))
    return out
