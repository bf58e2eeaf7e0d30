"""The fake engine's vocabulary: code points as text tokens, the script's specials after them.

Text tokens are code points (id = code point) and specials follow 0x110000, so the plain
tokenizer can never produce a marker id. Both the engine and its scripted replies read it.
"""

from __future__ import annotations

from waste.domain.chatjson.k2tools import TOOL_MARKERS
from waste.domain.chatjson.load import chat_json_markers
from waste.domain.ports import InvalidArgument
from waste.domain.xtml.markers import SPECIALS as XTML_SPECIALS

from waste.adapters.fake.script import FakeScript

N_BASE_VOCAB = 0x110000
EOS = "[EOS]"


def special_texts(script: FakeScript) -> list[str]:
    """The fake vocabulary's specials, in id order after the code points."""
    texts = [EOS]
    if script.format == "xtml":
        texts += XTML_SPECIALS
    elif script.format == "chat.json":
        texts += [m for m in chat_json_markers(script.chat_json or {}) if m not in texts]
        if script.k2_tool_markers:
            texts += [m for m in TOOL_MARKERS if m not in texts]
    return texts


class FakeVocabulary:
    """Encoding and decoding for the fake: plain text, markup (specials anywhere), ids."""

    def __init__(self, script: FakeScript) -> None:
        self.specials = special_texts(script)
        self._special_ids = {t: N_BASE_VOCAB + i for i, t in enumerate(self.specials)}
        self._by_length = sorted(self.specials, key=len, reverse=True)

    @property
    def n_base_vocab(self) -> int:
        return N_BASE_VOCAB

    @property
    def size(self) -> int:
        return N_BASE_VOCAB + len(self.specials)

    def special_id(self, text: str) -> int | None:
        return self._special_ids.get(text)

    def text_ids(self, text: str) -> list[int]:
        """The plain encoding: one id per code point."""
        return [ord(ch) for ch in text]

    def markup_ids(self, text: str) -> list[int]:
        """The markup encoding: specials anywhere, longest match first."""
        ids, i = [], 0
        while i < len(text):
            for special in self._by_length:
                if text.startswith(special, i):
                    ids.append(self._special_ids[special])
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids

    def token_text(self, token: int) -> str:
        if 0 <= token < N_BASE_VOCAB:
            return chr(token)
        index = token - N_BASE_VOCAB
        if 0 <= index < len(self.specials):
            return self.specials[index]
        raise InvalidArgument(f"token id {token} is outside the vocabulary "
                              f"(0..{self.size - 1})")
