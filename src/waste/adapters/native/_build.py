"""The cffi builder for ``waste.adapters.native._libwaste`` (API mode, out of line).

The cdef is the region of ``native/include/waste.h`` between the CDEF markers, read
verbatim, plus the one ``extern "Python"`` token callback. The extension links the
static ``native/build/libwaste.a`` that ``make -C native`` produces (setup.py runs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from cffi import FFI

ROOT = Path(__file__).resolve().parents[4]
NATIVE = ROOT / "native"
HEADER = NATIVE / "include" / "waste.h"
STATIC_LIBRARY = NATIVE / "build" / "libwaste.a"
CDEF_BEGIN = "/* WASTE_CDEF_BEGIN */"
CDEF_END = "/* WASTE_CDEF_END */"

# The single Python entry point C may call: generate's token callback (docs/ENGINE.md §2).
CALLBACK_CDEF = 'extern "Python" int32_t _waste_on_token(const waste_token_info *info, void *user);\n'


def header_cdef(header: Path = HEADER) -> str:
    """The header text between the CDEF markers, exactly as written.

    Raises:
        ValueError: the header lacks the markers, or they are out of order.
    """
    text = header.read_text(encoding="utf-8")
    begin, end = text.find(CDEF_BEGIN), text.find(CDEF_END)
    if begin < 0 or end < 0 or end < begin:
        raise ValueError(f"{header}: expected {CDEF_BEGIN} ... {CDEF_END} in that order")
    return text[begin + len(CDEF_BEGIN):end]


def make_builder(static_library: Path = STATIC_LIBRARY, flags: Sequence[str] = ()) -> FFI:
    """An FFI configured to compile ``_libwaste`` against the header and a static library.

    Args:
        static_library: the ``libwaste.a`` to link; the engine tests pass the ASan+UBSan
            build (``native/build-asan/libwaste.a``) to run the binding under sanitizers.
        flags: extra compiler and linker flags for the extension itself (``-fsanitize=...``).
    """
    builder = FFI()
    builder.cdef(header_cdef() + CALLBACK_CDEF)
    builder.set_source(
        "waste.adapters.native._libwaste",
        '#include "waste.h"\n',
        include_dirs=[str(NATIVE / "include")],
        extra_objects=[str(static_library)],
        libraries=["m", "pthread"],
        depends=[str(HEADER), str(static_library)],
        extra_compile_args=list(flags),
        extra_link_args=list(flags),
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
