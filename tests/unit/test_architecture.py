"""Dependencies point inward: waste.domain imports only the stdlib, attrs and itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

DOMAIN = Path(__file__).resolve().parents[2] / "src" / "waste" / "domain"
FORBIDDEN = ("trio", "quart", "quart_trio", "hypercorn", "cffi", "waste.adapters", "waste.app",
             "httpx", "PIL")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_domain_sources_import_nothing_outward():
    offenders = []
    files = sorted(DOMAIN.glob("*.py"))
    assert len(files) > 5
    for path in files:
        for name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_the_check_catches_an_offender(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import trio\nfrom waste.adapters.fake import FakeEngine\n")
    assert {"trio", "waste.adapters.fake"} <= imported_modules(bad)


def test_importing_the_whole_domain_loads_no_outer_layer():
    modules = [f"waste.domain.{p.stem}" for p in DOMAIN.glob("*.py") if p.stem != "__init__"]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} "
              "or m.startswith(('waste.adapters', 'waste.app'))]\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
