"""Segments: the unit a prompt is built from, each tokenized on its own.

A markup segment goes through the tokenizer that recognises special tokens; a plain one
through the tokenizer that never does. Keeping them apart is what stops caller content
from writing prompt structure (docs/XTML.md §1).
"""

from __future__ import annotations

from typing import NamedTuple


class Segment(NamedTuple):
    """One piece of a prompt. A NamedTuple so that ``list(seg)`` equals a golden's pair."""

    text: str
    markup: bool


def markup(text: str) -> list[Segment]:
    """A markup segment, or nothing when ``text`` is empty (segments are never empty)."""
    return [Segment(text, True)] if text else []


def plain(text: str) -> list[Segment]:
    """A plain segment, or nothing when ``text`` is empty (segments are never empty)."""
    return [Segment(text, False)] if text else []
