"""Editing a container's manifest in place, for tests that corrupt one on purpose."""

from __future__ import annotations

import json
from pathlib import Path


def edit_manifest(path: Path, fn) -> None:
    """Load ``path/manifest.json``, let ``fn`` change the dict, write it back."""
    m = json.loads((path / "manifest.json").read_text())
    fn(m)
    (path / "manifest.json").write_text(json.dumps(m))


def tensor(m: dict, name: str) -> dict:
    """The tensor index entry called ``name``."""
    return next(t for t in m["tensors"] if t["name"] == name)
