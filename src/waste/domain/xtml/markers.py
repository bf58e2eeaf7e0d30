"""Every XTML special token, named once (docs/XTML.md §1, §3.8).

The four structural markers decide the prompt's and the reply's shape; the media markers
frame an image. ``XtmlMarkerIds`` holds the structural ones' token ids in a vocabulary.
"""

from __future__ import annotations

import attrs

OPEN, SEP, CLOSE, END_OF_MSG = "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"
STRUCTURE = (OPEN, SEP, CLOSE, END_OF_MSG)

MEDIA_BEGIN, MEDIA_CONTENT, MEDIA_PAD, MEDIA_END = (
    "<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>")
MEDIA_PLACEHOLDER = "<|kimi_image_placeholder|>"
MEDIA = (MEDIA_BEGIN, MEDIA_CONTENT, MEDIA_PAD, MEDIA_END, MEDIA_PLACEHOLDER)

# Every special an XTML vocabulary carries, in the order a vocabulary built for it lists them.
SPECIALS = STRUCTURE + MEDIA


@attrs.frozen
class XtmlMarkerIds:
    """The token ids of the four structural markers, resolved from the vocabulary.

    Field order is ``STRUCTURE``'s order, so ``XtmlMarkerIds(*ids)`` works.
    """

    open: int
    sep: int
    close: int
    end_of_msg: int
