"""Image sources to RGB8 pixels with Pillow, under docs/HTTP.md §7's policy.

Base64 data URLs only; http(s) is never fetched (that would let clients aim the server at
addresses of their choosing); local paths only with --allow-local-images. Pixels stay in
memory: no temporary file is ever written.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from typing import Sequence

from PIL import Image

from waste.domain.errors import InvalidRequest
from waste.domain.ports import PromptImage
from waste.domain.requests import ImagePart, image_kind, local_image_path

MAX_IMAGES = 8
MAX_ENCODED_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 50_000_000
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_DATA_URL = re.compile(r"^data:(?P<mime>[^,;]*)(?P<params>(?:;[^,;]*)*),(?P<data>.*)$",
                       re.DOTALL | re.IGNORECASE)


def decode_images(parts: Sequence[ImagePart], *, vision: bool,
                  allow_local: bool) -> list[PromptImage]:
    """Decode every image part, or raise InvalidRequest with the docs/HTTP.md §5 code and
    param. Implements the ``ImageDecoder`` port."""
    if not parts:
        return []
    if not vision:
        raise InvalidRequest("This server has no vision tower loaded (start it with --vision).",
                             parts[0].part_param, "vision_disabled")
    if len(parts) > MAX_IMAGES:
        raise InvalidRequest(f"At most {MAX_IMAGES} images per request; this one has {len(parts)}.",
                             "messages", "too_many_images")
    return [_decode_one(part, allow_local) for part in parts]


def _decode_one(part: ImagePart, allow_local: bool) -> PromptImage:
    kind = image_kind(part.url)
    if kind == "remote":
        raise InvalidRequest("remote image URLs are not fetched; send a base64 data: URL",
                             part.param, "remote_image_refused")
    if kind == "local":
        if not allow_local:
            raise InvalidRequest("local image paths are refused; start the server with "
                                 "--allow-local-images to allow them", part.param,
                                 "local_image_refused")
        raw = _read_local(part)
    elif kind == "data":
        raw = _read_data_url(part)
    else:
        raise InvalidRequest("an image must be a base64 data: URL", part.param, "invalid_image")
    return _pixels(raw, part)


def _read_data_url(part: ImagePart) -> bytes:
    match = _DATA_URL.match(part.url)
    if not match or "base64" not in [p.strip().lower() for p in match["params"].split(";")]:
        raise InvalidRequest("an image data: URL must be base64 (data:image/…;base64,…)",
                             part.param, "invalid_image")
    mime = match["mime"].strip().lower()
    if mime and not mime.startswith("image/"):
        raise InvalidRequest(f"data: URL type {mime!r} is not an image", part.param, "invalid_image")
    data = re.sub(r"\s+", "", match["data"])
    if len(data) * 3 // 4 > MAX_ENCODED_BYTES:
        raise InvalidRequest("image is larger than 20 MiB", part.param, "image_too_large")
    data += "=" * (-len(data) % 4)  # padding is optional
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("image data is not valid base64", part.param, "invalid_image") from None


def _read_local(part: ImagePart) -> bytes:
    path = local_image_path(part.url)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_ENCODED_BYTES + 1)
    except OSError as exc:
        raise InvalidRequest(f"cannot read the local image: {exc.strerror}", part.param,
                             "invalid_image") from None
    if len(raw) > MAX_ENCODED_BYTES:
        raise InvalidRequest("image is larger than 20 MiB", part.param, "image_too_large")
    return raw


def _pixels(raw: bytes, part: ImagePart) -> PromptImage:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw), formats=FORMATS) as img:
                width, height = img.size
                if width * height > MAX_PIXELS:
                    raise InvalidRequest(f"image is {width}x{height}, over 50 megapixels",
                                         part.param, "image_too_large")
                img.seek(0)  # GIF: the first frame
                rgb = img.convert("RGB").tobytes()
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidRequest("image is over 50 megapixels", part.param, "image_too_large") from None
    except Exception:  # Pillow raises many types for undecodable input
        raise InvalidRequest("the image could not be decoded (PNG, JPEG, WebP, GIF or BMP)",
                             part.param, "invalid_image") from None
    return PromptImage(rgb=rgb, width=width, height=height)
