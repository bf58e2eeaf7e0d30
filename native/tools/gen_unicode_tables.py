"""Generate native/src/unicode_tables.{h,c}: the code-point classes of Kimi's PAT.

Each class is probed from tiktoken's own regex engine; run from the repo root with
``.venv/bin/python native/tools/gen_unicode_tables.py``. The outputs are committed, so
the build never needs tiktoken.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import re
import sys

import tiktoken

# Why probe rather than read the UCD: for each class in PAT we build a tiktoken.Encoding
# whose pattern is that one class and whose ranks are the 256 single bytes, encode every
# code point, and record which ones came back. The C scanner then sees exactly the classes
# of tiktoken's Rust regex (\p{Han} = Script=Han, \s = White_Space), at its Unicode
# version. The one exception is the pre-chunking whitespace bit: Python's str.isspace,
# because Kimi's reference pre-chunker is Python code.
MAX_CP = 0x110000
BLOCK = 256

# (C macro name, bit, class pattern exactly as it appears in PAT, comment)
CLASSES = [
    ("WT_CP_HAN", 0, r"[\p{Han}]", "[\\p{Han}]"),
    ("WT_CP_P", 1, r"[^\r\n\p{L}\p{N}]", "[^\\r\\n\\p{L}\\p{N}]  (optional prefix)"),
    (
        "WT_CP_U",
        2,
        r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]",
        "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]",
    ),
    (
        "WT_CP_LW",
        3,
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]",
        "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]",
    ),
    ("WT_CP_N", 4, r"\p{N}", "\\p{N}"),
    ("WT_CP_Q", 5, r"[^\s\p{L}\p{N}]", "[^\\s\\p{L}\\p{N}]"),
    ("WT_CP_WS", 6, r"\s", "\\s (Rust regex: White_Space)"),
]
PYSPACE_BIT = 7

# Letters of the case-insensitive contraction group (?i:'s|'t|'re|'ve|'m|'ll|'d).
FOLD_LETTERS = "strvemld"

# Code points first assigned in a given Unicode version, used to infer the version of
# the tables tiktoken's regex engine was built with (newest first).
VERSION_SENTINELS = [
    ("17.0", 0x323B0, "WT_CP_HAN"),  # CJK Unified Ideographs Extension J
    ("16.0", 0x1C89, "WT_CP_U"),  # CYRILLIC CAPITAL LETTER TJE
    ("15.1", 0x2EBF0, "WT_CP_HAN"),  # CJK Unified Ideographs Extension I
    ("15.0", 0x31350, "WT_CP_HAN"),  # CJK Unified Ideographs Extension H
    ("14.0", 0x2B739, "WT_CP_HAN"),  # CJK Unified Ideographs Extension B addition
]


def _all_scalar_values() -> list[int]:
    return [cp for cp in range(MAX_CP) if not 0xD800 <= cp < 0xE000]


def probe_class(pattern: str) -> set[int]:
    """Return the code points that tiktoken's regex engine matches with `pattern`.

    Args:
        pattern: A regex matching exactly one code point.

    Returns:
        The set of matching Unicode scalar values.
    """
    ranks = {bytes([b]): b for b in range(256)}
    enc = tiktoken.Encoding(
        name="probe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
    )
    cps = _all_scalar_values()
    members: set[int] = set()
    step = 1 << 16
    for lo in range(0, len(cps), step):
        text = "".join(map(chr, cps[lo : lo + step]))
        matched = bytes(enc.encode_ordinary(text)).decode("utf-8")
        members.update(map(ord, matched))
    return members


def build_flags() -> tuple[bytearray, dict[str, set[int]]]:
    flags = bytearray(MAX_CP)
    sets: dict[str, set[int]] = {}
    for name, bit, pattern, _ in CLASSES:
        members = probe_class(pattern)
        sets[name] = members
        for cp in members:
            flags[cp] |= 1 << bit
    for cp in _all_scalar_values():
        if chr(cp).isspace():
            flags[cp] |= 1 << PYSPACE_BIT
    return flags, sets


def check_coverage(flags: bytearray) -> None:
    """Every scalar value must start a match of some PAT branch, or tiktoken drops it.

    The C scanner relies on this (it has no "skip an unmatched code point" path).
    """
    any_branch = 0
    for name, bit, _, _ in CLASSES:
        if name in ("WT_CP_HAN", "WT_CP_U", "WT_CP_LW", "WT_CP_N", "WT_CP_Q", "WT_CP_WS"):
            any_branch |= 1 << bit
    missing = [cp for cp in _all_scalar_values() if not flags[cp] & any_branch]
    if missing:
        raise SystemExit(f"code points matched by no PAT branch: {[hex(c) for c in missing[:20]]}")


def infer_unicode_version(sets: dict[str, set[int]]) -> str:
    for version, cp, name in VERSION_SENTINELS:
        if cp in sets[name]:
            return version
    return "unknown (older than 14.0)"


def engine_versions() -> str:
    """Names tiktoken and the Rust regex crates compiled into it, for the record."""
    so_files = list(pathlib.Path(tiktoken.__file__).parent.glob("_tiktoken*.so"))
    crates: set[str] = set()
    for so in so_files:
        data = so.read_bytes()
        for m in re.finditer(rb"(fancy-regex|regex-syntax|regex-automata)-\d+\.\d+\.\d+", data):
            crates.add(m.group().decode())
    return f"tiktoken {importlib.metadata.version('tiktoken')}" + (
        " (" + ", ".join(sorted(crates)) + ")" if crates else ""
    )


def two_level(flags: bytearray) -> tuple[list[int], list[bytes]]:
    index: list[int] = []
    blocks: list[bytes] = []
    seen: dict[bytes, int] = {}
    for lo in range(0, MAX_CP, BLOCK):
        block = bytes(flags[lo : lo + BLOCK])
        if block not in seen:
            seen[block] = len(blocks)
            blocks.append(block)
        index.append(seen[block])
    return index, blocks


def render_header(unicode_version: str, provenance: str) -> str:
    bits = "\n".join(
        f"#define {name} 0x{1 << bit:02x}u /* {comment} */" for name, bit, _, comment in CLASSES
    )
    return f"""/* Generated by native/tools/gen_unicode_tables.py -- do not edit.
 *
 * Code-point classes of Kimi's pre-tokenizer pattern, probed from {provenance}.
 * Unicode version (inferred from probes): {unicode_version}.
 */
#ifndef WASTE_UNICODE_TABLES_H
#define WASTE_UNICODE_TABLES_H

#include <stdint.h>

#define WT_UNICODE_VERSION "{unicode_version}"
#define WT_UNICODE_PROVENANCE "{provenance}"

{bits}
#define WT_CP_PYSPACE 0x{1 << PYSPACE_BIT:02x}u /* Python str.isspace (Kimi's pre-chunker) */

/* Flags of one Unicode scalar value; 0 for surrogates and values >= 0x110000. */
uint8_t wt_cp_flags(uint32_t cp);

/* Non-zero if cp matches letter (one of "{FOLD_LETTERS}") under tiktoken's (?i:). */
int wt_cp_folds_to(uint32_t cp, char letter);

#endif
"""


def render_source(
    index: list[int], blocks: list[bytes], folds: dict[str, list[int]], unicode_version: str
) -> str:
    out = [
        "/* Generated by native/tools/gen_unicode_tables.py -- do not edit.",
        f" * Unicode {unicode_version}; two-level table: {len(blocks)} distinct blocks of {BLOCK}.",
        " */",
        '#include "unicode_tables.h"',
        "",
        f"static const uint16_t wt_cp_index[{len(index)}] = {{",
    ]
    for lo in range(0, len(index), 16):
        out.append("    " + ", ".join(str(v) for v in index[lo : lo + 16]) + ",")
    out.append("};")
    out.append("")
    out.append(f"static const uint8_t wt_cp_blocks[{len(blocks)}][{BLOCK}] = {{")
    for block in blocks:
        out.append("    {")
        for lo in range(0, BLOCK, 32):
            out.append("        " + ",".join(str(v) for v in block[lo : lo + 32]) + ",")
        out.append("    },")
    out.append("};")
    out.append("")
    out.append("uint8_t wt_cp_flags(uint32_t cp)")
    out.append("{")
    out.append(f"    if (cp >= 0x{MAX_CP:X}u) return 0;")
    out.append(f"    return wt_cp_blocks[wt_cp_index[cp >> 8]][cp & 0xFFu];")
    out.append("}")
    out.append("")
    out.append("int wt_cp_folds_to(uint32_t cp, char letter)")
    out.append("{")
    out.append("    switch (letter) {")
    for letter in FOLD_LETTERS:
        cond = " || ".join(f"cp == 0x{cp:X}u" for cp in folds[letter])
        out.append(f"    case '{letter}': return {cond};")
    out.append("    default: return 0;")
    out.append("    }")
    out.append("}")
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="native/src", type=pathlib.Path)
    args = parser.parse_args(argv)

    flags, sets = build_flags()
    check_coverage(flags)
    folds = {letter: sorted(probe_class(f"(?i:{letter})")) for letter in FOLD_LETTERS}
    unicode_version = infer_unicode_version(sets)
    provenance = engine_versions()
    index, blocks = two_level(flags)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "unicode_tables.h").write_text(render_header(unicode_version, provenance))
    (args.out_dir / "unicode_tables.c").write_text(
        render_source(index, blocks, folds, unicode_version)
    )
    print(
        f"Unicode {unicode_version}, {provenance}: {len(blocks)} blocks; "
        + ", ".join(f"{name}={len(s)}" for name, s in sets.items())
        + "; folds "
        + " ".join(f"{k}:{[hex(c) for c in v]}" for k, v in folds.items()),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
