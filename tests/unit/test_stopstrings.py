"""Stop strings over streamed content: held in whole tokens, never leaked (docs/HTTP.md §4.3)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from waste.domain.reply.stop_strings import ContentPiece, StopStringFilter


def run(tokens: list[str], stops: tuple[str, ...]) -> tuple[list[ContentPiece], StopStringFilter]:
    f = StopStringFilter(stops)
    out: list[ContentPiece] = []
    for i, token in enumerate(tokens):
        out += f.push(ContentPiece(token, -float(i)))
        if f.matched:
            break
    out += f.flush()
    return out, f


def expected(text: str, stops: tuple[str, ...]) -> str:
    """The text a character-by-character stream keeps: cut at the first stop to complete."""
    for end in range(len(text) + 1):
        starts = [end - len(s) for s in stops if s and text[:end].endswith(s)]
        if starts:
            return text[: min(starts)]
    return text


def test_the_stop_that_completes_first_wins_whatever_the_tokens():
    for tokens in ([" E", " "], [" E "], [" ", "E", " "]):
        out, f = run(tokens, ("E", " E "))
        assert ("".join(p.text for p in out), f.matched) == (" ", "E")


def test_split_stop_is_never_leaked():
    out, f = run(["Once up", "on a t", "ime"], ("upon",))
    assert "".join(p.text for p in out) == "Once "
    assert f.matched == "upon"


def test_held_tail_is_released_when_it_cannot_match():
    f = StopStringFilter(("END",))
    assert f.push(ContentPiece("the E", -1.0)) == []  # "E" could start END: whole token held
    released = f.push(ContentPiece("ast", -2.0))
    assert [p.text for p in released] == ["the E", "ast"]


def test_logprobs_stay_with_their_tokens():
    out, _ = run(["ab", "cX", "Yd"], ("XY",))
    assert [(p.text, p.logprob) for p in out] == [("ab", -0.0), ("c", -1.0)]


def test_no_stops_releases_immediately():
    f = StopStringFilter(())
    assert f.push(ContentPiece("x", None)) == [ContentPiece("x", None)]


@given(st.lists(st.text(alphabet="abE N", max_size=4), max_size=12),
       st.lists(st.text(alphabet="abE N", min_size=1, max_size=3), max_size=3))
def test_any_tokenization_gives_the_cut_text(tokens, stops):
    stops = tuple(stops)
    out, _ = run(tokens, stops)
    text = "".join(p.text for p in out)
    assert text == expected("".join(tokens), stops)
    assert not any(s in text for s in stops)
