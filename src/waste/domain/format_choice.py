"""Choosing a container's chat format once, at load: XTML, else its chat.json, else none.

An unusable container is not an exception: it still serves the routes that need no chat
format, so selection returns a ``NoFormat`` holding both reasons.
"""

from __future__ import annotations

from waste.domain.chat_format import ChatFormat, NoFormat
from waste.domain.chatjson.load import load_chat_format, single_special
from waste.domain.errors import ChatFormatError
from waste.domain.ports import Vocabulary
from waste.domain.xtml.format import XtmlFormat
from waste.domain.xtml.markers import STRUCTURE, XtmlMarkerIds


def select_chat_format(vocab: Vocabulary, chat_json_text: str | None, *,
                       image_placeholder_id: int | None = None,
                       vision: bool = False, chat_json_first: bool = False) -> ChatFormat:
    """XTML when all four of its markers are single special tokens, else the chat.json.

    Only ``vocab.tokenize_markup`` may raise (an engine error: no tokenizer, say).

    Args:
        vocab: the container's tokenizer.
        chat_json_text: the container's chat.json text, or None when it has none.
        image_placeholder_id: the token the engine expands into an image's positions
            (``ModelInfo.media_placeholder_id``), for the chat.json ``image`` check.
        vision: the model has a vision tower (XTML then accepts images).
        chat_json_first: the chat.json was chosen explicitly (``--chat-format``): it is
            used even when the XTML markers exist, and a refusal raises instead of being
            held.

    Raises:
        ChatFormatError: ``chat_json_first`` and the chat.json does not fit the vocabulary.
    """
    if chat_json_first and chat_json_text is not None:
        return load_chat_format(chat_json_text, vocab, image_placeholder_id=image_placeholder_id)
    xtml_ids = [single_special(vocab, marker) for marker in STRUCTURE]
    found = [i for i in xtml_ids if i is not None]
    if len(found) == len(STRUCTURE):
        return XtmlFormat(marker_ids=XtmlMarkerIds(*found), vision=vision)
    missing = ", ".join(m for m, i in zip(STRUCTURE, xtml_ids) if i is None)
    if chat_json_text is None:
        why_not_chat_json = "the container has no chat.json"
    else:
        try:
            return load_chat_format(chat_json_text, vocab,
                                    image_placeholder_id=image_placeholder_id)
        except ChatFormatError as err:
            why_not_chat_json = err.message.rstrip(".")
    return NoFormat(
        error=f"No usable chat format: the tokenizer lacks the XTML marker(s) {missing} as "
              f"single tokens, and {why_not_chat_json}.")


def unreadable_chat_format(why: str) -> ChatFormat:
    """The format of a container whose chat.json or tokenizer could not be read."""
    return NoFormat(error=why)
