"""The repository stands alone: nothing cites a document a user who clones it does not have.

Two rules, each reported as ``path:line: text`` for every offence:
1. No tracked file refers to the design inputs the docs/ documents were written from (the
   lower-case spec names, the notes on the stack, a sibling ``shared`` folder, the serving
   brief). Their content lives in docs/ under upper-case names: docs/HTTP.md, docs/ENGINE.md,
   docs/XTML.md, docs/CHATJSON.md, docs/STACK.md.
2. Every relative link in a tracked markdown file points at a file or directory that exists.

The first rule runs once per area of the tree (``-k in_docs``, ``-k in_src`` … select one),
so an area's owner can check it alone. The forbidden names are built from pieces so that this file
does not match itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_MD = "." + "md"
OUTSIDE_REFERENCES = (
    "http" + _MD, "engine" + _MD, "xtml" + _MD, "chatjson" + _MD,   # the design inputs, by name
    "stack" + "-notes",
    "SERVE" + _MD,
    "../" + "shared", "/work/" + "shared", "shared/" + "docs", "shared/" + "fixtures",
)
_OUTSIDE = re.compile("|".join(re.escape(s) for s in OUTSIDE_REFERENCES))

# [text](target) outside code; images too. Targets with a scheme or only an anchor are not files.
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`+[^`\n]*`+")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")

AREAS = ("README.md", "docs", "bench", "examples", "src", "tests", "native", "other")


def tracked_files() -> list[str]:
    """Paths of every file git tracks (relative to the repository root)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout ({proc.stderr.decode(errors='replace').strip()})")
    return [p for p in proc.stdout.decode("utf-8").split("\0") if p and not p.startswith(".git/")]


def area_of(path: str) -> str:
    top = path.split("/", 1)[0]
    return top if top in AREAS and (top != "README.md" or path == "README.md") else "other"


def outside_references(path: Path, shown_as: str) -> list[str]:
    """``shown_as:line: text`` for every line of ``path`` that cites an outside document."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (UnicodeDecodeError, FileNotFoundError):
        return []  # binary files cite nothing; a deleted-but-tracked file is git's business
    return [f"{shown_as}:{n}: {line.strip()[:160]}"
            for n, line in enumerate(text.splitlines(), 1) if _OUTSIDE.search(line)]


def broken_links(path: Path, shown_as: str, root: Path) -> list[str]:
    """``shown_as:line: target`` for every relative markdown link whose target does not exist."""
    problems, in_fence = [], False
    for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if target.startswith("#") or _SCHEME.match(target):
                continue
            file_part = target.split("#", 1)[0]
            resolved = (root / file_part.lstrip("/")) if file_part.startswith("/") \
                else (path.parent / file_part)
            if not resolved.exists():
                problems.append(f"{shown_as}:{n}: link to {target!r}, which does not exist")
    return problems


@pytest.mark.parametrize("area", AREAS, ids=lambda a: "in_" + a.replace(".", "_"))
def test_no_tracked_file_cites_a_document_outside_the_repository(area):
    offences = []
    for rel in tracked_files():
        if area_of(rel) == area:
            offences += outside_references(ROOT / rel, rel)
    assert not offences, (
        "these lines cite documents a user who clones the repository does not have "
        "(cite docs/HTTP.md, docs/ENGINE.md, docs/XTML.md, docs/CHATJSON.md, docs/STACK.md):\n"
        + "\n".join(offences))


def test_relative_markdown_links_resolve():
    problems = []
    for rel in tracked_files():
        if rel.endswith(".md"):
            problems += broken_links(ROOT / rel, rel, ROOT)
    assert not problems, "broken relative links:\n" + "\n".join(problems)


def test_the_docs_the_citations_point_at_exist():
    for name in ("HTTP", "ENGINE", "XTML", "CHATJSON", "STACK", "FORMAT", "DECISIONS", "README"):
        assert (ROOT / "docs" / (name + _MD)).is_file(), f"docs/{name}{_MD} is missing"


# ---- the rules catch planted violations -----------------------------------------------------

def test_a_planted_outside_citation_is_reported_with_file_and_line(tmp_path):
    planted = tmp_path / "mod.py"
    lines = ["ok = 1", f"# see {'engine' + _MD} §5", "fine = 'docs/ENGINE.md §5'",
             f"x = '{'../' + 'shared'}/docs'", f"# {'stack' + '-notes'} pitfall 1"]
    planted.write_text("\n".join(lines) + "\n", "utf-8")
    found = outside_references(planted, "mod.py")
    assert [f.split(":", 2)[1] for f in found] == ["2", "4", "5"]
    assert found[0].startswith("mod.py:2: # see ")


def test_every_forbidden_name_is_caught_and_upper_case_names_are_not(tmp_path):
    for name in OUTSIDE_REFERENCES:
        planted = tmp_path / "a.txt"
        planted.write_text(f"cite {name} here\n", "utf-8")
        assert outside_references(planted, "a.txt") == [f"a.txt:1: cite {name} here"], name
    clean = tmp_path / "b.txt"
    clean.write_text("docs/HTTP.md §9.1, docs/ENGINE.md, docs/XTML.md, docs/CHATJSON.md, "
                     "docs/STACK.md pitfall 1\n", "utf-8")
    assert outside_references(clean, "b.txt") == []


def test_a_planted_broken_link_is_reported_with_file_and_line(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A\n", "utf-8")
    doc = tmp_path / "docs" / "B.md"
    doc.write_text("\n".join([
        "[ok](A.md) and [ok too](A.md#a) and [web](https://example.com) and [here](#x)",
        "[gone](MISSING.md)",
        "`[in code](NOPE.md)`",
        "```",
        "[in a fence](NOPE.md)",
        "```",
        "[up](../README.md)",
    ]) + "\n", "utf-8")
    assert broken_links(doc, "docs/B.md", tmp_path) == [
        "docs/B.md:2: link to 'MISSING.md', which does not exist",
        "docs/B.md:7: link to '../README.md', which does not exist",
    ]
